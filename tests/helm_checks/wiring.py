"""How rendered objects refer to each other: in-cluster URLs (and the proxy they bypass),
selectors, ConfigMaps, Secrets."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from urllib.parse import urlsplit

from tests.deploy_checks import PROXY_BYPASS, Problem
from tests.helm_checks.helm import NAMESPACE, RELEASE
from tests.helm_checks.manifests import (
    Manifest,
    by_kind,
    container_ports,
    containers,
    environment,
    is_chatqna,
    name_of,
    pod_spec,
    workloads,
)


def _service_ports(service: Manifest) -> set[int]:
    return {int(p["port"]) for p in service["spec"].get("ports") or []}


def url_problems(docs: list[Manifest]) -> list[Problem]:
    """In-cluster URLs in ChatQnA containers name a rendered Service and one of its ports."""
    services = by_kind(docs, "Service")
    default_ports = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}
    problems = []
    for workload in workloads(docs):
        for container in containers(workload):
            if not is_chatqna(container):
                continue
            for key, value in environment(docs, workload, container).items():
                parts = urlsplit(value or "")
                if parts.scheme not in default_ports or not parts.hostname:
                    continue
                where = f"{name_of(workload)}:{key}"
                host = parts.hostname
                short = host.removesuffix(f".{NAMESPACE}.svc.cluster.local")
                short = short.removesuffix(f".{NAMESPACE}.svc").removesuffix(f".{NAMESPACE}")
                if "." in short:
                    continue  # outside this namespace: nothing to check
                if short not in services:
                    if short.startswith(RELEASE):
                        problems.append(Problem("unknown_service", where, f"{value}"))
                    continue
                port = parts.port if parts.port is not None else default_ports[parts.scheme]
                if port not in _service_ports(services[short]):
                    ports = sorted(_service_ports(services[short]))
                    problems.append(Problem("wrong_port", where, f"{value}: {short} has {ports}"))
    return problems


def _release_service(host: str, services: Mapping[str, Manifest]) -> bool:
    """Whether `host` names a rendered Service, by its short or namespaced name."""
    short = host.removesuffix(f".{NAMESPACE}.svc.cluster.local")
    short = short.removesuffix(f".{NAMESPACE}.svc").removesuffix(f".{NAMESPACE}")
    return short in services


def _bypassed(host: str, entries: set[str]) -> bool:
    # An entry is a host name, or a domain suffix with its leading dot (`.svc`), as
    # httpx2, requests and gRPC read NO_PROXY.
    return host in entries or any(e.startswith(".") and host.endswith(e) for e in entries)


def proxy_problems(docs: list[Manifest]) -> list[Problem]:
    """Each ChatQnA container's NO_PROXY and no_proxy cover every rendered Service its URLs
    name, so a proxy set in `config` never carries its calls to the release's services."""
    services = by_kind(docs, "Service")
    problems = []
    for workload in workloads(docs):
        for container in containers(workload):
            if not is_chatqna(container):
                continue
            env = environment(docs, workload, container)
            hosts = {urlsplit(value).hostname for value in env.values() if value and "://" in value}
            called = sorted(h for h in hosts if h and _release_service(h, services))
            for variable in PROXY_BYPASS:
                entries = {e.strip() for e in (env.get(variable) or "").split(",") if e.strip()}
                missing = [host for host in called if not _bypassed(host, entries)]
                if missing:
                    where = f"{name_of(workload)}:{variable}"
                    problems.append(
                        Problem("proxied_service", where, f"does not name {', '.join(missing)}")
                    )
    return problems


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def reference_problems(docs: list[Manifest], external: Iterable[str] = ()) -> list[Problem]:
    """Services select some pod; pods' ConfigMaps and Secrets are rendered or external."""
    problems = []
    pods = [
        (w, (w["spec"]["template"].get("metadata") or {}).get("labels") or {})
        for w in workloads(docs)
    ]
    for name, service in by_kind(docs, "Service").items():
        selector = service["spec"].get("selector") or {}
        selected = [w for w, labels in pods if _matches(selector, labels)]
        if not selected:
            problems.append(Problem("selects_nothing", f"Service/{name}", str(selector)))
        for port in service["spec"].get("ports") or []:
            target = port.get("targetPort", port["port"])
            if selected and not any(
                str(target) in container_ports(c) for w in selected for c in containers(w)
            ):
                problems.append(
                    Problem("target_port", f"Service/{name}", f"no selected pod has {target}")
                )
    for name, budget in by_kind(docs, "PodDisruptionBudget").items():
        selector = budget["spec"]["selector"].get("matchLabels") or {}
        if not any(_matches(selector, labels) for _, labels in pods):
            problems.append(
                Problem("selects_nothing", f"PodDisruptionBudget/{name}", str(selector))
            )
    rendered = {("ConfigMap", n) for n in by_kind(docs, "ConfigMap")}
    rendered |= {("Secret", n) for n in by_kind(docs, "Secret")}
    rendered |= {("Secret", n) for n in external}
    for workload in workloads(docs):
        for kind, ref in _references(workload):
            if (kind, ref) not in rendered:
                problems.append(Problem("dangling_reference", name_of(workload), f"{kind} {ref}"))
    return problems


def _references(workload: Manifest) -> Iterator[tuple[str, str]]:
    spec = pod_spec(workload)
    for volume in spec.get("volumes") or []:
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]
    for container in containers(workload):
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                yield "ConfigMap", source["configMapRef"]["name"]
            if "secretRef" in source:
                yield "Secret", source["secretRef"]["name"]
        for entry in container.get("env") or []:
            source = entry.get("valueFrom") or {}
            if "configMapKeyRef" in source:
                yield "ConfigMap", source["configMapKeyRef"]["name"]
            if "secretKeyRef" in source:
                yield "Secret", source["secretKeyRef"]["name"]
