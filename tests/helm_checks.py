"""Checks of the Helm chart (deploy/helm/chatqna): rendered offline, validated, cross-checked.

`render()` runs `helm template` with the helm binary `scripts/k8s-tools` installs (cached in
.cache/k8s-tools); every other check is a function that takes parsed manifests or chart files
and returns a list of `Problem`s, so the tests run it on the chart and on copies with a
planted mistake. No cluster and no network after the first install. From the repository
root, `.venv/bin/python -m tests.helm_checks` prints the chart's problems.

What is checked, for each values file the chart ships (the defaults, values-*.yaml):

- `helm lint --strict` passes and every rendered manifest validates, with unknown fields
  rejected, against the Kubernetes OpenAPI schemas of `KUBERNETES_VERSION`
  (kubernetes-validate, a pinned test dependency that carries them), and against those of
  the oldest version the chart admits (`kubeVersion` in Chart.yaml).
- ChatQnA containers (the chatqna image): liveness on /v1/health_check and readiness on
  /v1/ready, on a port the container declares and the role's port setting says; every
  environment variable and settings ConfigMap key is a setting of chatqna/settings.py;
  secrets (the API key, upstream tokens) come from a Secret, never a literal or a ConfigMap;
  every in-cluster URL they are given names a rendered Service and one of its ports.
- ChatQnA pods wait in an init container (the ChatQnA image) for the model servers and Redis
  of the release their role uses, and for nothing else (not for external endpoints); its
  script compiles, and each attempt catches any exception (an answer in another protocol
  raises http.client's errors or ValueError, not OSError), so the wait never crashes.
- Every container has probes (init containers aside), CPU and memory requests, a memory
  limit, and cannot escalate privileges; every pod runs as non-root without a Kubernetes
  API token. Services and disruption budgets select pods of the release, and
  ConfigMaps and Secrets referenced by pods are rendered (or named as external).
- With an API key, the metrics scraper's jobs send it (`authorization.credentials_file`, a
  file mounted from the key's Secret); without one, they send no credentials. A Secret the
  chart does not render (`secrets.existingSecret`) holds the key unless the caller names
  it as keyless (`secrets.existingSecretHasApiKey=false`).
- With a metrics scraper, every pod of each ChatQnA workload is a scrape target (a job
  resolving a headless Service that selects it, on its role's port).
- ChatQnA containers sleep in preStop (Kubernetes' sleep action) and the pod's grace period
  exceeds that sleep plus uvicorn's graceful shutdown (chatqna/cli.py) and the tracing's
  shutdown bound (chatqna/telemetry/tracing.py).
- Grafana's dashboards are deploy/grafana's, byte for byte, and its datasources are
  deploy/grafana's except for the URLs.
- Names: StatefulSets within 52 characters (their revision-hash label must fit in 63),
  Services and label values within 63, also with a release name of Helm's maximum 53.
- Chart files: values.yaml's `config` keys are settings, with .env.example's defaults;
  every top-level key of values.yaml is in the chart README's values table and every key
  in that table exists.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.deploy_checks import (
    Problem,
    container_variables,
    parse_env_example,
)

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "chatqna"
TOOLS = REPO / "scripts" / "k8s-tools"
KUBERNETES_VERSION = "1.37.0"
# The oldest version Chart.yaml's kubeVersion admits: the manifests must validate there too.
OLDEST_KUBERNETES_VERSION = "1.29.0"
RELEASE = "rel"
NAMESPACE = "chatqna"
# The values files shipped beside values.yaml; each must render and validate.
VALUES_FILES = ("values-redis-cluster.yaml", "values-embedded.yaml")
CHATQNA_IMAGE = "chatqna"
# Secrets the service reads: given as a literal or in a ConfigMap, they would leak.
SECRET_SETTINGS = {"CHATQNA_API_KEY", "OPENAI_API_KEY"}
# Probe paths per container kind.
CHATQNA_LIVENESS = "/v1/health_check"
CHATQNA_READINESS = "/v1/ready"

Manifest = dict[str, Any]


# --- helm ----------------------------------------------------------------------------------


def helm_binary() -> Path:
    """The helm binary, installed (once, cached) by scripts/k8s-tools."""
    result = subprocess.run(
        [str(TOOLS), "paths"], capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"scripts/k8s-tools paths failed:\n{result.stderr}")
    return Path(result.stdout.strip())


class RenderError(RuntimeError):
    """`helm template` failed; the message is helm's."""


def _helm_errors(stderr: str) -> str:
    """helm's stderr without its notes on the chart's symbolic link (files/grafana)."""
    return "\n".join(
        line for line in stderr.strip().splitlines() if "found symbolic link" not in line
    )


def _value_args(values: Iterable[Path], sets: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for path in values:
        args += ["--values", str(path)]
    for key, value in sets.items():
        # Strings stay strings ("false" would be truthy in a template); bools and numbers not.
        if isinstance(value, bool):
            args += ["--set", f"{key}={str(value).lower()}"]
        else:
            args += ["--set-string" if isinstance(value, str) else "--set", f"{key}={value}"]
    return args


def render_text(
    helm: Path,
    values: Iterable[Path] = (),
    sets: Mapping[str, Any] | None = None,
    chart: Path = CHART,
    release: str = RELEASE,
) -> str:
    command = [
        str(helm),
        "template",
        release,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBERNETES_VERSION,
        *_value_args(values, sets or {}),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise RenderError(_helm_errors(result.stderr))
    return result.stdout


def parse_manifests(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(
    helm: Path,
    values: Iterable[Path] = (),
    sets: Mapping[str, Any] | None = None,
    chart: Path = CHART,
    release: str = RELEASE,
) -> list[Manifest]:
    return parse_manifests(render_text(helm, values, sets, chart, release))


def lint_problems(helm: Path, values: Iterable[Path] = (), chart: Path = CHART) -> list[Problem]:
    result = subprocess.run(
        [str(helm), "lint", "--strict", str(chart), *_value_args(values, {})],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode == 0:
        return []
    return [Problem("lint", chart.name, f"{result.stdout.strip()}\n{_helm_errors(result.stderr)}")]


# --- the Kubernetes schemas ----------------------------------------------------------------


def name_of(doc: Manifest) -> str:
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


@functools.lru_cache(maxsize=4096)
def _validate(text: str, version: str) -> tuple[Problem, ...]:
    """One manifest (as canonical JSON) against the schemas; remembered, since reading a
    schema file takes far longer than checking a manifest against it."""
    import kubernetes_validate.utils as validation

    doc = json.loads(text)
    try:
        validation.validate(doc, version, strict=True)
    except validation.ValidationError as error:
        path = ".".join(str(p) for p in error.path) or "(top)"
        return (Problem("schema", f"{name_of(doc)}:{path}", error.message),)
    except validation.SchemaNotFoundError as error:
        return (Problem("schema", name_of(doc), error.message),)
    return ()


def schema_problems(docs: Iterable[Manifest], version: str = KUBERNETES_VERSION) -> list[Problem]:
    """Each manifest against the pinned Kubernetes version's schemas, unknown fields rejected."""
    return [p for doc in docs for p in _validate(json.dumps(doc, sort_keys=True), version)]


# --- walking the manifests -----------------------------------------------------------------

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


# --- checks on rendered manifests ----------------------------------------------------------


def _role_port(container: Mapping[str, Any], env: Mapping[str, str | None]) -> tuple[str, int]:
    args = [str(a) for a in container.get("args") or ["serve"]]
    if args[0] == "retriever":
        return "RETRIEVER_SERVICE_PORT", int(env.get("RETRIEVER_SERVICE_PORT") or 7000)
    return "MEGA_SERVICE_PORT", int(env.get("MEGA_SERVICE_PORT") or 8888)


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
            setting, listens = _role_port(container, env)
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
            _, port = _role_port(container, environment(docs, workload, container))
            if not any(
                p == port and selector and selector.items() <= labels.items()
                for selector, p in scraped
            ):
                where = f"{name_of(workload)}/{container['name']}"
                problems.append(Problem("not_scraped", where, f"no scrape job for port {port}"))
    return problems


def shutdown_bound_seconds() -> float:
    """How long a ChatQnA server may take to stop after SIGTERM: uvicorn's graceful shutdown
    (chatqna/cli.py) and then the flush of queued spans (chatqna/telemetry/tracing.py)."""
    from chatqna.cli import server_options
    from chatqna.settings import Settings
    from chatqna.telemetry.tracing import SHUTDOWN_TIMEOUT_SECONDS

    graceful = float(server_options(Settings())["timeout_graceful_shutdown"])
    return graceful + SHUTDOWN_TIMEOUT_SECONDS


# Kubernetes' default terminationGracePeriodSeconds.
DEFAULT_GRACE_SECONDS = 30


def termination_problems(docs: list[Manifest], bound: float | None = None) -> list[Problem]:
    """ChatQnA containers sleep in preStop (Kubernetes' sleep action) while the endpoints drop
    the pod, and the pod's grace period exceeds that sleep plus `bound` (the server's and
    the tracing's shutdown bounds), so SIGKILL never cuts a graceful shutdown short."""
    bound = shutdown_bound_seconds() if bound is None else bound
    problems = []
    for workload in workloads(docs):
        grace = pod_spec(workload).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        for container in filter(is_chatqna, containers(workload)):
            where = f"{name_of(workload)}/{container['name']}"
            pre_stop = (container.get("lifecycle") or {}).get("preStop") or {}
            sleep = int((pre_stop.get("sleep") or {}).get("seconds", 0))
            if not sleep:
                problems.append(Problem("no_prestop_sleep", where, f"preStop {pre_stop}"))
            if grace <= sleep + bound:
                detail = f"terminationGracePeriodSeconds {grace} <= preStop {sleep} + {bound}"
                problems.append(Problem("grace_period", where, detail))
    return problems


# Helm's longest release name; a StatefulSet's name plus "-" and a revision hash of up to 10
# characters is its pods' controller-revision-hash label, at most 63 characters.
LONGEST_RELEASE = 53
STATEFULSET_NAME_LIMIT = 52
LABEL_LIMIT = 63


def name_length_problems(docs: list[Manifest]) -> list[Problem]:
    """Names and label values Kubernetes accepts and can build on: StatefulSets within 52
    characters, Services and label values within 63."""
    problems = []
    for doc in docs:
        name = doc["metadata"]["name"]
        limit = {"StatefulSet": STATEFULSET_NAME_LIMIT, "Service": LABEL_LIMIT}.get(doc["kind"])
        if limit is not None and len(name) > limit:
            problems.append(Problem("name_length", name_of(doc), f"{len(name)} > {limit}"))
        for value in (doc["metadata"].get("labels") or {}).values():
            if len(str(value)) > LABEL_LIMIT:
                problems.append(Problem("label_length", name_of(doc), str(value)))
    return problems


# Upstreams a ChatQnA role checks as it starts: in the release, an init container waits for them.
WAITED_FOR = ("TEI_EMBEDDING_ENDPOINT", "TEI_RERANKING_ENDPOINT", "REDIS_URL")


def _release_service(url: str, services: Mapping[str, Manifest]) -> str | None:
    """The rendered Service an in-cluster URL names, if any."""
    host = urlsplit(url).hostname or ""
    short = host.removesuffix(f".{NAMESPACE}.svc.cluster.local").removesuffix(f".{NAMESPACE}.svc")
    return short if short in services else None


def startup_wait_problems(docs: list[Manifest]) -> list[Problem]:
    """A ChatQnA pod waits, in an init container of the ChatQnA image, for each model server
    and Redis of the release that its role uses (TEI on /health), and for nothing else."""
    services = by_kind(docs, "Service")
    problems = []
    for workload in workloads(docs):
        inits = list(pod_spec(workload).get("initContainers") or [])
        waited = {
            urlsplit(str(arg)).netloc: urlsplit(str(arg))
            for init in inits
            for arg in init.get("args") or []
            if "://" in str(arg)
        }
        needed: set[str] = set()
        for container in containers(workload):
            if is_chatqna(container):
                env = environment(docs, workload, container)
                urls = [env.get(key) or "" for key in WAITED_FOR]
                needed |= {urlsplit(u).netloc for u in urls if _release_service(u, services)}
        where = name_of(workload)
        for netloc in sorted(needed - set(waited)):
            problems.append(Problem("no_startup_wait", where, netloc))
        for netloc, parts in sorted(waited.items()):
            if netloc not in needed:
                problems.append(Problem("needless_startup_wait", where, parts.geturl()))
            elif parts.scheme.startswith("http") and parts.path != "/health":
                problems.append(Problem("startup_wait_path", where, parts.geturl()))
        problems += [Problem("wait_image", where, i["image"]) for i in inits if not is_chatqna(i)]
    return problems


WAIT_CONTAINER = "wait-for-upstreams"
# Handlers that catch whatever one attempt of the wait raises.
CATCH_ALL = {"Exception", "BaseException"}


def wait_script(workload: Manifest) -> tuple[str, list[str]] | None:
    """The Python script of a pod's start-up wait and its targets, if it has one."""
    for init in pod_spec(workload).get("initContainers") or []:
        if init["name"] == WAIT_CONTAINER:
            command = [str(part) for part in init.get("command") or []]
            if command[:2] != ["python", "-c"] or len(command) != 3:
                return " ".join(command), []
            return command[2], [str(arg) for arg in init.get("args") or []]
    return None


def _catches_everything(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(n is None or (isinstance(n, ast.Name) and n.id in CATCH_ALL) for n in names)


def wait_script_problems(docs: list[Manifest]) -> list[Problem]:
    """The start-up wait's script is Python that compiles, and each attempt in it catches any
    exception: an exception it lets through ends the init container, and Kubernetes restarts
    it with a growing back-off instead of the wait going on."""
    problems = []
    for workload in workloads(docs):
        found = wait_script(workload)
        if found is None:
            continue
        where = f"{name_of(workload)}/{WAIT_CONTAINER}"
        try:
            tree = ast.parse(found[0])
        except SyntaxError as error:
            problems.append(Problem("wait_script", where, f"does not compile: {error}"))
            continue
        tries = [node for node in ast.walk(tree) if isinstance(node, ast.Try)]
        if not tries or not all(any(map(_catches_everything, t.handlers)) for t in tries):
            problems.append(Problem("wait_script", where, "an attempt lets exceptions through"))
    return problems


def manifest_problems(
    docs: list[Manifest],
    external_secrets: Iterable[str] = (),
    keyless_secrets: Iterable[str] = (),
) -> list[Problem]:
    """Every check of rendered manifests. `external_secrets`: Secrets the release uses but does
    not render; `keyless_secrets`: those of them without CHATQNA_API_KEY."""
    return (
        schema_problems(docs)
        + probe_problems(docs)
        + settings_problems(docs)
        + security_problems(docs)
        + url_problems(docs)
        + reference_problems(docs, external_secrets)
        + grafana_problems(docs)
        + scrape_auth_problems(docs, keyless_secrets)
        + scrape_coverage_problems(docs)
        + termination_problems(docs)
        + startup_wait_problems(docs)
        + wait_script_problems(docs)
        + name_length_problems(docs)
    )


# --- checks on the chart's files -----------------------------------------------------------

TABLE_KEY = re.compile(r"^\|\s*`(?P<key>[A-Za-z0-9_.\[\]-]+)`\s*\|", re.M)


def documented_keys(readme: str) -> set[str]:
    """Keys in the first column of the README's values table(s), in backticks."""
    return {match["key"] for match in TABLE_KEY.finditer(readme)}


def _has_path(values: Mapping[str, Any], dotted: str) -> bool:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def values_doc_problems(values: Mapping[str, Any], readme: str) -> list[Problem]:
    """Every top-level key is documented; every documented key exists."""
    documented = documented_keys(readme)
    problems = [
        Problem("undocumented_value", "values.yaml", key)
        for key in values
        if not any(d == key or d.startswith(f"{key}.") for d in documented)
    ]
    problems += [
        Problem("stale_value_doc", "README.md", key)
        for key in sorted(documented)
        if not _has_path(values, key)
    ]
    return problems


def config_problems(values: Mapping[str, Any], env_example: str) -> list[Problem]:
    """values.yaml's `config` keys are settings (or the OpenTelemetry SDK's variables), with
    the defaults .env.example gives them."""
    known = container_variables()
    documented = parse_env_example(env_example).settings
    problems = []
    for key, value in (values.get("config") or {}).items():
        if key not in known:
            problems.append(Problem("unknown_setting", "values.yaml:config", key))
        elif key in documented and str(value) != documented[key]:
            problems.append(
                Problem(
                    "default_mismatch",
                    f"values.yaml:config.{key}",
                    f"{value!r} vs .env.example {documented[key]!r}",
                )
            )
    return problems


def chart_file_problems(chart: Path = CHART, repo: Path = REPO) -> list[Problem]:
    values = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
    readme = (chart / "README.md").read_text(encoding="utf-8")
    env_example = (repo / ".env.example").read_text(encoding="utf-8")
    return values_doc_problems(values, readme) + config_problems(values, env_example)


# --- everything, on the chart --------------------------------------------------------------


def chart_problems(helm: Path, chart: Path = CHART) -> list[Problem]:
    problems = chart_file_problems(chart)
    for files in ((), *((chart / name,) for name in VALUES_FILES)):
        label = files[0].name if files else "values.yaml"
        problems += lint_problems(helm, files, chart)
        try:
            docs = render(helm, files, chart=chart)
        except RenderError as error:
            problems.append(Problem("render", label, str(error)))
            continue
        found = manifest_problems(docs) + schema_problems(docs, OLDEST_KUBERNETES_VERSION)
        problems += [Problem(p.kind, f"{label}:{p.where}", p.detail) for p in found]
    try:
        long_names = render(helm, chart=chart, release="r" * LONGEST_RELEASE)
    except RenderError as error:
        return [*problems, Problem("render", "longest release name", str(error))]
    found = name_length_problems(long_names)
    return problems + [Problem(p.kind, f"longest release name:{p.where}", p.detail) for p in found]


if __name__ == "__main__":
    found = chart_problems(helm_binary())
    for problem in found:
        print(problem)
    print(f"{len(found)} problem(s)")
    sys.exit(1 if found else 0)
