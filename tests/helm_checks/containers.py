"""ChatQnA containers' probes and settings, and every container's security and resources."""

from __future__ import annotations

from tests.deploy_checks import Problem, container_variables
from tests.helm_checks.manifests import (
    Manifest,
    container_ports,
    containers,
    environment,
    is_chatqna,
    name_of,
    pod_spec,
    probe_target,
    role_port,
    settings_configmap_keys,
    workloads,
)

# Secrets the service reads: given as a literal or in a ConfigMap, they would leak.
SECRET_SETTINGS = {"CHATQNA_API_KEY", "OPENAI_API_KEY"}
# Probe paths per container kind.
CHATQNA_LIVENESS = "/v1/health_check"
CHATQNA_READINESS = "/v1/ready"


def probe_problems(docs: list[Manifest]) -> list[Problem]:
    """Probes exist, point at a declared port, and ChatQnA's at its health endpoints."""
    problems = []
    for workload in workloads(docs):
        for container in containers(workload):
            where = f"{name_of(workload)}/{container['name']}"
            ports = container_ports(container)
            probes = {k: container.get(k) for k in ("livenessProbe", "readinessProbe")}
            for kind, probe in probes.items():
                path, port = probe_target(probe)
                if probe is None:
                    problems.append(Problem("missing_probe", where, f"no {kind}"))
                elif port is not None and "exec" not in probe and port not in ports:
                    problems.append(
                        Problem("probe_port", where, f"{kind} port {port} is not a container port")
                    )
            if not is_chatqna(container):
                continue
            env = environment(docs, workload, container)
            setting, listens = role_port(container, env)
            if listens not in ports.values():
                problems.append(
                    Problem("role_port", where, f"{setting}={listens}, ports {sorted(ports)}")
                )
            expected = {"livenessProbe": CHATQNA_LIVENESS, "readinessProbe": CHATQNA_READINESS}
            for kind, want in expected.items():
                path, port = probe_target(probes[kind])
                if probes[kind] is not None and path != want:
                    problems.append(Problem("probe_path", where, f"{kind} on {path}, not {want}"))
                if port is not None and ports.get(port) != listens:
                    problems.append(
                        Problem("probe_port", where, f"{kind} on port {port}, serving {listens}")
                    )
    return problems


def settings_problems(docs: list[Manifest]) -> list[Problem]:
    """ChatQnA containers get only settings, and secrets only from a Secret."""
    known = container_variables()
    problems = []
    for workload in workloads(docs):
        for container in containers(workload):
            if not is_chatqna(container):
                continue
            where = f"{name_of(workload)}/{container['name']}"
            for key in settings_configmap_keys(docs, workload):
                if key not in known:
                    problems.append(Problem("unknown_setting", f"{where}:configmap", key))
                if key in SECRET_SETTINGS:
                    problems.append(Problem("plain_secret", f"{where}:configmap", key))
            for entry in container.get("env") or []:
                if entry["name"] not in known:
                    problems.append(Problem("unknown_setting", f"{where}:env", entry["name"]))
                source = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if entry["name"] in SECRET_SETTINGS and source is None:
                    problems.append(Problem("plain_secret", f"{where}:env", entry["name"]))
    return problems


def security_problems(docs: list[Manifest]) -> list[Problem]:
    """Non-root pods, no privilege escalation, requests and a memory limit everywhere."""
    problems = []
    for workload in workloads(docs):
        spec = pod_spec(workload)
        pod = spec.get("securityContext") or {}
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(
                Problem("service_account_token", name_of(workload), "API token mounted")
            )
        for container in [*(spec.get("initContainers") or []), *containers(workload)]:
            where = f"{name_of(workload)}/{container['name']}"
            own = container.get("securityContext") or {}
            non_root = own.get("runAsNonRoot", pod.get("runAsNonRoot"))
            user = own.get("runAsUser", pod.get("runAsUser"))
            if non_root is not True or user == 0:
                problems.append(Problem("root", where, f"runAsNonRoot={non_root}, user={user}"))
            if own.get("allowPrivilegeEscalation") is not False:
                problems.append(Problem("privilege_escalation", where, "not explicitly false"))
            resources = container.get("resources") or {}
            requests = resources.get("requests") or {}
            if not {"cpu", "memory"} <= set(requests):
                problems.append(Problem("no_requests", where, f"requests {sorted(requests)}"))
            if "memory" not in (resources.get("limits") or {}):
                problems.append(Problem("no_memory_limit", where, "no memory limit"))
    return problems
