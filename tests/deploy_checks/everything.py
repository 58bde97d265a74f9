"""Every check, on the repository's files."""

from __future__ import annotations

from pathlib import Path

from tests.deploy_checks.compose import interpolate_doc, load_yaml, merge
from tests.deploy_checks.dockerfile import dockerfile_problems, package_data_problems
from tests.deploy_checks.files import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    OVERRIDE_FILES,
    REPO,
    SCRAPE_CONFIG,
    Problem,
)
from tests.deploy_checks.schema import compose_schema, schema_problems
from tests.deploy_checks.settings_env import parse_env_example
from tests.deploy_checks.variables import variable_problems
from tests.deploy_checks.wiring import (
    deploy_config_urls,
    override_problems,
    scrape_coverage_problems,
    wiring_problems,
)


def repository_problems(repo: Path = REPO) -> list[Problem]:
    env = parse_env_example((repo / ENV_EXAMPLE).read_text(encoding="utf-8"))
    raw = {
        name: load_yaml((repo / name).read_text(encoding="utf-8"))
        for name in (COMPOSE_FILE, *OVERRIDE_FILES)
    }
    schema = compose_schema()
    problems = variable_problems(raw, env)
    base = raw[COMPOSE_FILE]
    for name, doc in raw.items():
        for label, values in (("defaults", {}), ("env-example", env.values)):
            problems += schema_problems(interpolate_doc(doc, values), schema, f"{name}[{label}]")
        if name != COMPOSE_FILE:
            problems += override_problems(base, doc, name)
            merged = interpolate_doc(merge(base, doc), env.values)
            problems += schema_problems(merged, schema, f"{COMPOSE_FILE}+{name}")
    problems += wiring_problems(interpolate_doc(base, {}), repo, deploy_config_urls(repo))
    scrape = load_yaml((repo / SCRAPE_CONFIG).read_text(encoding="utf-8"))
    problems += scrape_coverage_problems(interpolate_doc(base, {}), scrape)
    problems += dockerfile_problems(
        (repo / "Dockerfile").read_text(encoding="utf-8"),
        (repo / ".dockerignore").read_text(encoding="utf-8"),
        repo,
        (repo / "scripts" / "setup-venv").read_text(encoding="utf-8"),
    )
    problems += package_data_problems(
        (repo / "pyproject.toml").read_text(encoding="utf-8"), repo / "chatqna"
    )
    return problems
