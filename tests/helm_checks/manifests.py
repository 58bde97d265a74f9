"""Walking rendered manifests: workloads, their pods and containers, what a container sees."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

Manifest = dict[str, Any]
CHATQNA_IMAGE = "chatqna"


def name_of(doc: Manifest) -> str:
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def workloads(docs: Iterable[Manifest]) -> Iterator[Manifest]:
    return (doc for doc in docs if doc.get("kind") in WORKLOADS)


def by_kind(docs: Iterable[Manifest], kind: str) -> dict[str, Manifest]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc.get("kind") == kind}


def pod_spec(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Manifest) -> list[dict[str, Any]]:
    return list(pod_spec(workload).get("containers") or [])


def is_chatqna(container: Mapping[str, Any]) -> bool:
    image = str(container.get("image", ""))
    return image.rsplit("/", 1)[-1].split(":", 1)[0] == CHATQNA_IMAGE


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    """Port name (or the number as text) -> number."""
    ports: dict[str, int] = {}
    for port in container.get("ports") or []:
        number = int(port["containerPort"])
        ports[str(number)] = number
        if port.get("name"):
            ports[str(port["name"])] = number
    return ports


def probe_target(probe: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(HTTP path or None, port as text or None) of a probe."""
    if not probe:
        return None, None
    for handler in ("httpGet", "tcpSocket", "grpc"):
        if handler in probe:
            port = probe[handler].get("port")
            return probe[handler].get("path"), None if port is None else str(port)
    return None, None


def settings_configmap_keys(docs: Iterable[Manifest], workload: Manifest) -> dict[str, str]:
    """Keys of the ConfigMaps a ChatQnA workload loads with envFrom."""
    maps = by_kind(docs, "ConfigMap")
    keys: dict[str, str] = {}
    for container in containers(workload):
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef")
            if ref and ref["name"] in maps:
                keys.update((maps[ref["name"]].get("data") or {}).items())
    return keys


def environment(
    docs: Iterable[Manifest], workload: Manifest, container: Mapping[str, Any]
) -> dict[str, str | None]:
    """What the container's process sees: envFrom ConfigMaps, then env (None: from a Secret)."""
    env: dict[str, str | None] = dict(settings_configmap_keys(docs, workload))
    for entry in container.get("env") or []:
        env[entry["name"]] = entry.get("value") if "valueFrom" not in entry else None
    return env


def role_port(container: Mapping[str, Any], env: Mapping[str, str | None]) -> tuple[str, int]:
    args = [str(a) for a in container.get("args") or ["serve"]]
    if args[0] == "retriever":
        return "RETRIEVER_SERVICE_PORT", int(env.get("RETRIEVER_SERVICE_PORT") or 7000)
    return "MEGA_SERVICE_PORT", int(env.get("MEGA_SERVICE_PORT") or 8888)
