"""Wiring: ChatQnA containers listen on the settings' default ports, every URL they (and the
Grafana and scrape configs) are given names a compose service and a port it listens on, they
wait for those services to be healthy, each one the stack starts by default is a target of
the scrape config on its role's port, their `NO_PROXY` and `no_proxy` name every service
they call, and bind mounts and volumes exist."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chatqna.settings import Settings
from tests.deploy_checks.compose import environment_entries, load_yaml
from tests.deploy_checks.files import COMPOSE_FILE, REPO, SCRAPE_CONFIG, Problem
from tests.deploy_checks.settings_env import PROXY_BYPASS, container_variables

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
