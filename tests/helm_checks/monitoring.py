"""Grafana's dashboards and datasources, and the metrics scraper's credentials and targets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.deploy_checks import Problem
from tests.helm_checks.helm import NAMESPACE, REPO
from tests.helm_checks.manifests import (
    Manifest,
    by_kind,
    containers,
    environment,
    is_chatqna,
    name_of,
    pod_spec,
    role_port,
    workloads,
)


def grafana_problems(docs: list[Manifest], repo: Path = REPO) -> list[Problem]:
    """Grafana's ConfigMaps carry deploy/grafana's dashboards and datasources (URLs aside)."""
    maps = by_kind(docs, "ConfigMap")
    dashboards = next((m for n, m in maps.items() if n.endswith("-grafana-dashboards")), None)
    provisioning = next((m for n, m in maps.items() if n.endswith("-grafana-provisioning")), None)
    if dashboards is None or provisioning is None:
        return []
    problems = []
    source = repo / "deploy" / "grafana"
    files = {p.name: p.read_text(encoding="utf-8") for p in (source / "dashboards").glob("*.json")}
    shipped = dashboards.get("data") or {}
    for name in sorted(set(files) | set(shipped)):
        if files.get(name) != shipped.get(name):
            problems.append(Problem("dashboard_drift", f"ConfigMap/{name}", "differs from deploy/"))
    provider = (source / "provisioning" / "dashboards" / "dashboards.yaml").read_text()
    if (provisioning.get("data") or {}).get("dashboards.yaml") != provider:
        problems.append(Problem("dashboard_drift", "dashboards.yaml", "differs from deploy/"))
    original = yaml.safe_load(
        (source / "provisioning" / "datasources" / "datasources.yaml").read_text()
    )
    chart = yaml.safe_load((provisioning.get("data") or {}).get("datasources.yaml") or "{}")

    def without_urls(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in d.items() if k != "url"} for d in doc.get("datasources") or []]

    if without_urls(original) != without_urls(chart):
        problems.append(Problem("datasource_drift", "datasources.yaml", "differs from deploy/"))
    return problems


def api_key_secrets(docs: list[Manifest], keyless: Iterable[str] = ()) -> set[str]:
    """The Secrets ChatQnA containers take CHATQNA_API_KEY from, less rendered ones without
    that key and the external ones named in `keyless` (an optional reference to a missing
    key sets nothing)."""
    rendered = by_kind(docs, "Secret")
    names = {
        entry["valueFrom"]["secretKeyRef"]["name"]
        for workload in workloads(docs)
        for container in containers(workload)
        if is_chatqna(container)
        for entry in container.get("env") or []
        if entry["name"] == "CHATQNA_API_KEY" and "secretKeyRef" in (entry.get("valueFrom") or {})
    }
    names -= set(keyless)
    return {
        name
        for name in names
        if name not in rendered
        or "CHATQNA_API_KEY"
        in {**rendered[name].get("data", {}), **rendered[name].get("stringData", {})}
    }


def secret_file(workload: Manifest, container: Mapping[str, Any], path: str) -> tuple[str, str]:
    """(Secret, key) a container's file comes from, or ("", "") if none."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        source = volumes.get(mount["name"], {}).get("secret")
        directory = mount["mountPath"].rstrip("/")
        if source is None or not path.startswith(f"{directory}/"):
            continue
        name = path[len(directory) + 1 :]
        items = source.get("items") or [{"key": name, "path": name}]
        key = next((i["key"] for i in items if i["path"] == name), "")
        return (source["secretName"], key) if key else ("", "")
    return "", ""


def scrape_auth_problems(docs: list[Manifest], keyless: Iterable[str] = ()) -> list[Problem]:
    """With an API key, every scrape job of a mounted prometheus.yml sends it, read from a file
    mounted from the key's Secret; without one, no job sends credentials. `keyless`: external
    Secrets known to lack the key."""
    secrets = api_key_secrets(docs, keyless)
    maps = by_kind(docs, "ConfigMap")
    problems = []
    for workload in workloads(docs):
        volumes = {v["name"]: v for v in pod_spec(workload).get("volumes") or []}
        for container in containers(workload):
            for mount in container.get("volumeMounts") or []:
                source = volumes.get(mount["name"], {}).get("configMap") or {}
                data = (maps.get(source.get("name", "")) or {}).get("data") or {}
                if "prometheus.yml" not in data:
                    continue
                config = yaml.safe_load(data["prometheus.yml"]) or {}
                for job in config.get("scrape_configs") or []:
                    where = f"{name_of(workload)}:{job.get('job_name')}"
                    path = (job.get("authorization") or {}).get("credentials_file")
                    if not secrets:
                        if {"authorization", "basic_auth", "bearer_token"} & set(job):
                            problems.append(Problem("scrape_auth", where, "credentials, no key"))
                        continue
                    secret, key = secret_file(workload, container, str(path or ""))
                    if secret not in secrets or key != "CHATQNA_API_KEY":
                        detail = f"credentials_file {path!r} is not the API key of {secrets}"
                        problems.append(Problem("scrape_auth", where, detail))
    return problems


def scrape_config(docs: list[Manifest]) -> dict[str, Any] | None:
    """The parsed prometheus.yml of the release's ConfigMaps, if it renders one."""
    for config_map in by_kind(docs, "ConfigMap").values():
        text = (config_map.get("data") or {}).get("prometheus.yml")
        if text is not None:
            found: dict[str, Any] = yaml.safe_load(text) or {}
            return found
    return None


def _scraped_services(docs: list[Manifest], config: Mapping[str, Any]) -> list[tuple[Any, int]]:
    """(selector, port) of each headless Service a scrape job resolves to its pods' records."""
    services = by_kind(docs, "Service")
    scraped = []
    for job in config.get("scrape_configs") or []:
        for sd in job.get("dns_sd_configs") or []:
            for name in sd.get("names") or []:
                service = services.get(str(name).removesuffix(f".{NAMESPACE}.svc"))
                if service is not None and service["spec"].get("clusterIP") == "None":
                    scraped.append((service["spec"].get("selector") or {}, int(sd.get("port", 0))))
    return scraped


def scrape_coverage_problems(docs: list[Manifest]) -> list[Problem]:
    """With a metrics scraper, each pod of every ChatQnA workload (each role serves /metrics)
    is a target: a job resolves a headless Service selecting its pods, on the role's port."""
    config = scrape_config(docs)
    if config is None:
        return []
    scraped = _scraped_services(docs, config)
    problems = []
    for workload in workloads(docs):
        labels = workload["spec"]["template"]["metadata"].get("labels") or {}
        for container in filter(is_chatqna, containers(workload)):
            _, port = role_port(container, environment(docs, workload, container))
            if not any(
                p == port and selector and selector.items() <= labels.items()
                for selector, p in scraped
            ):
                where = f"{name_of(workload)}/{container['name']}"
                problems.append(Problem("not_scraped", where, f"no scrape job for port {port}"))
    return problems
