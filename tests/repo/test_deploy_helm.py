"""The Helm chart renders, validates and wires the services as the compose stack does.

`tests/helm_checks/` holds the checks; here they run on the chart rendered with each values
file it ships, on renders with other values, and on copies with one planted mistake each.
helm comes from `scripts/k8s-tools` (installed once into .cache/k8s-tools, like the browser
of the chat UI test); `helm template` is offline and takes a fraction of a second.
"""

from __future__ import annotations

import copy
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from chatqna.settings import Settings
from tests import helm_checks as checks
from tests.helm_checks import Manifest

CHART = checks.CHART
REPO = checks.REPO
PREFIX = f"{checks.RELEASE}-chatqna"


@pytest.fixture(scope="module")
def helm() -> Path:
    return checks.helm_binary()


@pytest.fixture(scope="module")
def default_docs(helm: Path) -> list[Manifest]:
    return checks.render(helm)


@pytest.fixture(scope="module")
def cluster_docs(helm: Path) -> list[Manifest]:
    return checks.render(helm, [CHART / "values-redis-cluster.yaml"])


@pytest.fixture(scope="module")
def embedded_docs(helm: Path) -> list[Manifest]:
    return checks.render(helm, [CHART / "values-embedded.yaml"])


def kinds(problems: list[checks.Problem]) -> set[str]:
    return {problem.kind for problem in problems}


def find(docs: list[Manifest], kind: str, component: str) -> Manifest:
    return checks.by_kind(docs, kind)[f"{PREFIX}-{component}"]


def container(docs: list[Manifest], kind: str, component: str) -> dict[str, Any]:
    return checks.containers(find(docs, kind, component))[0]


def settings_of(docs: list[Manifest], kind: str, component: str, **secrets: str) -> Settings:
    """The Settings a ChatQnA container would build from its environment (Secrets: `secrets`)."""
    workload = find(docs, kind, component)
    env = checks.environment(docs, workload, checks.containers(workload)[0])
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in Settings.model_fields]:
            patch.delenv(key.upper(), raising=False)
        for key, value in env.items():
            if value is not None:
                patch.setenv(key, value)
            elif key in secrets:
                patch.setenv(key, secrets[key])
        return Settings()


def env_entry(item: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((e for e in item.get("env") or [] if e["name"] == name), None)


# --- the chart as shipped ------------------------------------------------------------------


def test_the_chart_has_no_problems(helm: Path) -> None:
    problems = checks.chart_problems(helm)
    assert problems == [], "\n".join(str(p) for p in problems)


@pytest.mark.parametrize("fixture", ["default_docs", "cluster_docs", "embedded_docs"])
def test_every_values_file_renders_manifests_that_validate_strictly(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    docs: list[Manifest] = request.getfixturevalue(fixture)
    assert len(docs) >= 3
    assert all(doc["metadata"]["name"].startswith(PREFIX) for doc in docs)
    assert checks.schema_problems(docs) == []
    assert checks.manifest_problems(docs) == []


def test_the_manifests_validate_on_the_oldest_kubernetes_the_chart_admits(
    default_docs: list[Manifest],
) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={checks.OLDEST_KUBERNETES_VERSION}-0"
    assert checks.schema_problems(default_docs, checks.OLDEST_KUBERNETES_VERSION) == []
    # A field newer than that version (Service trafficDistribution, 1.30) is reported there.
    planted = copy.deepcopy(default_docs)
    find(planted, "Service", "redis")["spec"]["trafficDistribution"] = "PreferClose"
    assert checks.schema_problems(planted) == []
    old = checks.schema_problems(planted, checks.OLDEST_KUBERNETES_VERSION)
    assert [(p.kind, p.where) for p in old] == [("schema", f"Service/{PREFIX}-redis:spec")]


def test_the_default_render_holds_the_compose_stack(default_docs: list[Manifest]) -> None:
    workloads = {checks.name_of(w) for w in checks.workloads(default_docs)}
    assert workloads == {
        f"Deployment/{PREFIX}-backend",
        f"Deployment/{PREFIX}-retriever",
        f"StatefulSet/{PREFIX}-tei-embedding",
        f"StatefulSet/{PREFIX}-tei-reranking",
        f"StatefulSet/{PREFIX}-vllm",
        f"StatefulSet/{PREFIX}-redis",
        f"Deployment/{PREFIX}-victoriatraces",
        f"Deployment/{PREFIX}-victoriametrics",
        f"Deployment/{PREFIX}-grafana",
    }
    assert container(default_docs, "Deployment", "backend")["args"] == ["serve"]
    assert container(default_docs, "Deployment", "retriever")["args"] == ["retriever"]


def test_probes_point_at_the_health_endpoints(default_docs: list[Manifest]) -> None:
    for component, port in (("backend", 8888), ("retriever", 7000)):
        item = container(default_docs, "Deployment", component)
        assert checks.container_ports(item)["http"] == port
        assert item["livenessProbe"]["httpGet"] == {"path": "/v1/health_check", "port": "http"}
        assert item["readinessProbe"]["httpGet"] == {"path": "/v1/ready", "port": "http"}
        assert item["startupProbe"]["httpGet"]["path"] == "/v1/health_check"
    for component, port in (("tei-embedding", 8080), ("tei-reranking", 8080), ("vllm", 8000)):
        item = container(default_docs, "StatefulSet", component)
        assert checks.container_ports(item)["http"] == port
        assert str(port) in item["args"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert item[probe]["httpGet"] == {"path": "/health", "port": "http"}
        service = find(default_docs, "Service", component)
        assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]
    redis = container(default_docs, "StatefulSet", "redis")
    assert "redis-cli -p 6379 ping" in " ".join(redis["readinessProbe"]["exec"]["command"])


def test_the_backend_is_wired_like_the_compose_backend(default_docs: list[Manifest]) -> None:
    backend = settings_of(default_docs, "Deployment", "backend")
    assert backend.tei_embedding_endpoint == f"http://{PREFIX}-tei-embedding:80"
    assert backend.tei_reranking_endpoint == f"http://{PREFIX}-tei-reranking:80"
    assert backend.llm_endpoint == f"http://{PREFIX}-vllm:80/v1"
    assert backend.redis_url == f"redis://{PREFIX}-redis:6379"
    assert backend.retriever_endpoint is None
    assert backend.otel_exporter_otlp_endpoint == (
        f"http://{PREFIX}-victoriatraces:10428/insert/opentelemetry"
    )
    assert backend.chatqna_api_key is None
    vllm = container(default_docs, "StatefulSet", "vllm")
    # `vllm serve <model>`: the model positionally, whatever the image's entrypoint.
    assert vllm["command"] == ["vllm", "serve"]
    assert vllm["args"][0] == backend.llm_model_id and "--model" not in vllm["args"]
    tei = container(default_docs, "StatefulSet", "tei-embedding")["args"]
    assert tei[tei.index("--max-client-batch-size") + 1] == str(backend.tei_embedding_max_batch)
    # The retriever gets the shared endpoints but not the backend's own.
    retriever = settings_of(default_docs, "Deployment", "retriever")
    assert retriever.redis_url == backend.redis_url
    assert retriever.tei_embedding_endpoint == backend.tei_embedding_endpoint
    assert retriever.llm_endpoint is None and retriever.retriever_endpoint is None


@pytest.mark.parametrize("repository", ["vllm/vllm-openai-cpu", "vllm/vllm-openai"])
def test_vllm_has_a_user_name_without_a_passwd_entry(helm: Path, repository: str) -> None:
    # The CUDA image has no passwd entry for the pod's uid; getpass.getuser() reads $USER.
    docs = checks.render(helm, sets={"vllm.image.repository": repository})
    vllm = container(docs, "StatefulSet", "vllm")
    assert checks.pod_spec(find(docs, "StatefulSet", "vllm"))["securityContext"]["runAsUser"] != 0
    assert env_entry(vllm, "USER") == {"name": "USER", "value": "vllm"}
    assert env_entry(vllm, "HOME") == {"name": "HOME", "value": "/tmp"}


def test_redis_runs_as_a_statefulset_with_a_volume_claim(default_docs: list[Manifest]) -> None:
    redis = find(default_docs, "StatefulSet", "redis")
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    mounts = checks.containers(redis)[0]["volumeMounts"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in mounts
    env = env_entry(checks.containers(redis)[0], "REDIS_ARGS")
    assert env is not None and "--appendonly yes" in env["value"]


def test_the_cluster_values_point_at_an_external_redis(cluster_docs: list[Manifest]) -> None:
    values = yaml.safe_load((CHART / "values-redis-cluster.yaml").read_text())
    names = {checks.name_of(w) for w in checks.workloads(cluster_docs)}
    assert f"StatefulSet/{PREFIX}-redis" not in names
    assert f"Service/{PREFIX}-redis" not in {checks.name_of(d) for d in cluster_docs}
    for component in ("backend", "retriever"):
        settings = settings_of(cluster_docs, "Deployment", component)
        assert settings.redis_url == values["redis"]["externalUrl"]
        workload = find(cluster_docs, "Deployment", component)
        assert workload["spec"]["replicas"] == values[component]["replicas"]


def test_the_redis_url_can_come_from_a_secret(helm: Path) -> None:
    docs = checks.render(
        helm, sets={"redis.enabled": False, "redis.urlSecret.name": "redis-credentials"}
    )
    assert "REDIS_URL" not in (find(docs, "ConfigMap", "settings")["data"])
    for component in ("backend", "retriever"):
        entry = env_entry(container(docs, "Deployment", component), "REDIS_URL")
        assert entry is not None
        ref = entry["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "redis-credentials", "key": "REDIS_URL"}
    assert checks.manifest_problems(docs, external_secrets=["redis-credentials"]) == []
    assert "dangling_reference" in kinds(checks.reference_problems(docs))


def test_the_api_key_comes_from_a_secret_the_chart_creates(helm: Path) -> None:
    docs = checks.render(helm, sets={"secrets.apiKey": "s3cret-key"})
    secret = find(docs, "Secret", "secrets")
    assert secret["stringData"] == {"CHATQNA_API_KEY": "s3cret-key"}
    for component in ("backend", "retriever"):
        item = container(docs, "Deployment", component)
        entry = env_entry(item, "CHATQNA_API_KEY")
        assert entry is not None
        assert entry["valueFrom"]["secretKeyRef"]["name"] == f"{PREFIX}-secrets"
        assert "s3cret-key" not in yaml.safe_dump(item)
        settings = settings_of(docs, "Deployment", component, CHATQNA_API_KEY="s3cret-key")
        assert settings.chatqna_api_key is not None
        assert settings.chatqna_api_key.get_secret_value() == "s3cret-key"
    assert "s3cret-key" not in yaml.safe_dump(find(docs, "ConfigMap", "settings"))


def test_an_existing_secret_is_referenced_and_not_created(helm: Path) -> None:
    docs = checks.render(helm, sets={"secrets.existingSecret": "chatqna-keys"})
    assert f"{PREFIX}-secrets" not in checks.by_kind(docs, "Secret")
    backend = container(docs, "Deployment", "backend")
    for key in ("CHATQNA_API_KEY", "OPENAI_API_KEY"):
        entry = env_entry(backend, key)
        assert entry is not None
        ref = entry["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "chatqna-keys", "key": key, "optional": True}
    tei = env_entry(container(docs, "StatefulSet", "vllm"), "HF_TOKEN")
    assert tei is not None and tei["valueFrom"]["secretKeyRef"]["name"] == "chatqna-keys"
    assert checks.manifest_problems(docs, external_secrets=["chatqna-keys"]) == []


def test_without_a_key_no_secret_is_rendered(default_docs: list[Manifest]) -> None:
    assert f"{PREFIX}-secrets" not in checks.by_kind(default_docs, "Secret")
    assert env_entry(container(default_docs, "Deployment", "backend"), "CHATQNA_API_KEY") is None


def scrape_jobs(docs: list[Manifest]) -> list[dict[str, Any]]:
    data = find(docs, "ConfigMap", "victoriametrics-scrape")["data"]["prometheus.yml"]
    jobs: list[dict[str, Any]] = yaml.safe_load(data)["scrape_configs"]
    return jobs


@pytest.mark.parametrize(
    ("sets", "secret"),
    [
        ({"secrets.apiKey": "s3cret-key"}, f"{PREFIX}-secrets"),
        # The documented install: a Secret with the key, no other flag.
        ({"secrets.existingSecret": "chatqna-keys"}, "chatqna-keys"),
        (
            {"secrets.existingSecret": "chatqna-keys", "secrets.existingSecretHasApiKey": True},
            "chatqna-keys",
        ),
        # The flag speaks of existingSecret only: the chart knows its own Secret's keys.
        (
            {"secrets.apiKey": "s3cret-key", "secrets.existingSecretHasApiKey": False},
            f"{PREFIX}-secrets",
        ),
    ],
)
def test_with_an_api_key_the_metrics_scraper_sends_it(
    helm: Path, sets: dict[str, str], secret: str
) -> None:
    docs = checks.render(helm, sets=sets)
    jobs = scrape_jobs(docs)
    assert [job["job_name"] for job in jobs] == ["chatqna", "chatqna-retriever"]
    workload = find(docs, "Deployment", "victoriametrics")
    item = checks.containers(workload)[0]
    for job in jobs:
        path = job["authorization"]["credentials_file"]
        assert checks.secret_file(workload, item, path) == (secret, "CHATQNA_API_KEY")
    assert "s3cret-key" not in yaml.safe_dump(workload)
    assert checks.scrape_auth_problems(docs) == []
    assert checks.manifest_problems(docs, external_secrets=["chatqna-keys"]) == []


def test_without_an_api_key_the_metrics_scraper_sends_no_credentials(helm: Path) -> None:
    docs = checks.render(helm, sets={"secrets.openaiApiKey": "sk-only"})
    assert all("authorization" not in job for job in scrape_jobs(docs))
    workload = find(docs, "Deployment", "victoriametrics")
    assert all("secret" not in v for v in checks.pod_spec(workload)["volumes"])
    assert checks.scrape_auth_problems(docs) == []


def test_an_existing_secret_without_the_api_key_is_scraped_without_credentials(
    helm: Path,
) -> None:
    # A Secret with only OPENAI_API_KEY or HF_TOKEN: the backend's /metrics is open, and a
    # credentials_file from a Secret item that is not there would fail every scrape.
    sets = {"secrets.existingSecret": "chatqna-keys", "secrets.existingSecretHasApiKey": False}
    docs = checks.render(helm, sets=sets)
    assert all("authorization" not in job for job in scrape_jobs(docs))
    workload = find(docs, "Deployment", "victoriametrics")
    assert all("secret" not in v for v in checks.pod_spec(workload)["volumes"])
    # The backend still takes the key should the Secret hold one: never open by mistake.
    entry = env_entry(container(docs, "Deployment", "backend"), "CHATQNA_API_KEY")
    assert entry is not None and entry["valueFrom"]["secretKeyRef"]["name"] == "chatqna-keys"
    keys = {"external_secrets": ["chatqna-keys"], "keyless_secrets": ["chatqna-keys"]}
    assert checks.manifest_problems(docs, **keys) == []
    # Checked against what the Secret holds, either flag that says otherwise is reported.
    assert kinds(checks.scrape_auth_problems(docs)) == {"scrape_auth"}
    keyed = checks.render(helm, sets={"secrets.existingSecret": "chatqna-keys"})
    assert kinds(checks.scrape_auth_problems(keyed, ["chatqna-keys"])) == {"scrape_auth"}


def test_scrape_credentials_that_miss_the_api_key_are_reported(
    helm: Path, default_docs: list[Manifest]
) -> None:
    keyed = checks.render(helm, sets={"secrets.apiKey": "s3cret-key"})

    def unauthorized(docs: list[Manifest]) -> None:
        scrape = find(docs, "ConfigMap", "victoriametrics-scrape")["data"]
        scrape["prometheus.yml"] = scrape["prometheus.yml"].replace("authorization:", "x_auth:")

    def unmounted(docs: list[Manifest]) -> None:
        checks.containers(find(docs, "Deployment", "victoriametrics"))[0]["volumeMounts"].pop()

    def needless(docs: list[Manifest]) -> None:
        scrape = find(docs, "ConfigMap", "victoriametrics-scrape")["data"]
        scrape["prometheus.yml"] += "    bearer_token: x\n"

    assert kinds(planted(keyed, unauthorized)) == {"scrape_auth"}
    assert kinds(planted(keyed, unmounted)) == {"scrape_auth"}
    assert kinds(planted(default_docs, needless)) == {"scrape_auth"}


def test_the_retriever_is_scraped_only_when_it_runs(
    helm: Path, default_docs: list[Manifest]
) -> None:
    assert checks.scrape_coverage_problems(default_docs) == []
    docs = checks.render(helm, sets={"retriever.enabled": False})
    assert [job["job_name"] for job in scrape_jobs(docs)] == ["chatqna"]
    assert f"{PREFIX}-retriever-pods" not in checks.by_kind(docs, "Service")
    assert checks.manifest_problems(docs) == []


def test_a_chatqna_workload_without_a_scrape_job_is_reported(
    default_docs: list[Manifest],
) -> None:
    def unscraped(docs: list[Manifest]) -> None:
        scrape = find(docs, "ConfigMap", "victoriametrics-scrape")["data"]
        config = yaml.safe_load(scrape["prometheus.yml"])
        config["scrape_configs"].pop()
        scrape["prometheus.yml"] = yaml.safe_dump(config)

    def not_headless(docs: list[Manifest]) -> None:
        del find(docs, "Service", "retriever-pods")["spec"]["clusterIP"]

    for mutate in (unscraped, not_headless):
        (problem,) = planted(default_docs, mutate)
        assert (problem.kind, problem.where) == (
            "not_scraped",
            f"Deployment/{PREFIX}-retriever/retriever",
        )


def test_chatqna_pods_drain_before_they_stop(helm: Path, default_docs: list[Manifest]) -> None:
    # uvicorn's 5 s graceful shutdown (chatqna/cli.py), then up to 5 s of span export.
    assert checks.shutdown_bound_seconds() == 10
    for component in ("backend", "retriever"):
        workload = find(default_docs, "Deployment", component)
        assert checks.containers(workload)[0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
        assert checks.pod_spec(workload)["terminationGracePeriodSeconds"] == 20
    assert checks.termination_problems(default_docs) == []
    docs = checks.render(helm, sets={"backend.preStopSleepSeconds": 12})
    assert (
        checks.pod_spec(find(docs, "Deployment", "backend"))["terminationGracePeriodSeconds"] > 22
    )
    assert checks.termination_problems(docs) == []
    # 0 turns the sleep off; the missing sleep is then reported, the grace period still fits.
    docs = checks.render(helm, sets={"retriever.preStopSleepSeconds": 0})
    assert "lifecycle" not in container(docs, "Deployment", "retriever")
    assert checks.schema_problems(docs) == []
    assert kinds(checks.termination_problems(docs)) == {"no_prestop_sleep"}


def test_a_grace_period_shorter_than_the_shutdown_is_reported(
    default_docs: list[Manifest],
) -> None:
    def short(docs: list[Manifest]) -> None:
        checks.pod_spec(find(docs, "Deployment", "backend"))["terminationGracePeriodSeconds"] = 15

    def defaulted(docs: list[Manifest]) -> None:
        del checks.pod_spec(find(docs, "Deployment", "backend"))["terminationGracePeriodSeconds"]

    (problem,) = planted(default_docs, short)
    assert (problem.kind, problem.where) == ("grace_period", f"Deployment/{PREFIX}-backend/backend")
    assert planted(default_docs, defaulted) == []  # Kubernetes' 30 s cover 5 + 10
    longer = checks.termination_problems(default_docs, bound=30)
    assert kinds(longer) == {"grace_period"} and len(longer) == 2


def waits(docs: list[Manifest], component: str) -> list[str]:
    """What the component's pods wait for before they start (the init containers' targets)."""
    inits = checks.pod_spec(find(docs, "Deployment", component)).get("initContainers") or []
    return [str(arg) for init in inits for arg in init.get("args") or []]


def test_chatqna_pods_wait_for_the_model_servers_and_redis_of_the_release(
    default_docs: list[Manifest],
) -> None:
    embedding, reranking = (
        f"http://{PREFIX}-tei-{r}:80/health" for r in ("embedding", "reranking")
    )
    redis = f"redis://{PREFIX}-redis:6379"
    assert waits(default_docs, "backend") == [embedding, reranking, redis]
    assert waits(default_docs, "retriever") == [embedding, redis]  # it does not rerank
    for component in ("backend", "retriever"):
        spec = checks.pod_spec(find(default_docs, "Deployment", component))
        (init,) = spec["initContainers"]
        main = spec["containers"][0]
        assert init["image"] == main["image"] and init["command"][:2] == ["python", "-c"]
        assert init["securityContext"] == main["securityContext"]
    assert checks.startup_wait_problems(default_docs) == []


def test_external_and_disabled_upstreams_are_not_waited_for(
    helm: Path, cluster_docs: list[Manifest], embedded_docs: list[Manifest]
) -> None:
    # values-redis-cluster.yaml: Redis is outside the release, the model servers are not.
    assert waits(cluster_docs, "backend") == [
        f"http://{PREFIX}-tei-embedding:80/health",
        f"http://{PREFIX}-tei-reranking:80/health",
    ]
    assert waits(embedded_docs, "backend") == []
    docs = checks.render(
        helm,
        sets={
            "tei.embedding.enabled": False,
            "tei.embedding.externalUrl": "http://tei.models.svc:80",
            "tei.reranking.enabled": False,
            "redis.enabled": False,
            "redis.externalUrl": "redis://redis.data.svc:6379",
        },
    )
    for component in ("backend", "retriever"):
        assert "initContainers" not in checks.pod_spec(find(docs, "Deployment", component))
    assert checks.startup_wait_problems(docs) == []


def test_startup_wait_mistakes_are_reported(default_docs: list[Manifest]) -> None:
    def removed(docs: list[Manifest]) -> None:
        checks.pod_spec(find(docs, "Deployment", "retriever")).pop("initContainers")

    def needless(docs: list[Manifest]) -> None:
        init = checks.pod_spec(find(docs, "Deployment", "retriever"))["initContainers"][0]
        init["args"].append(f"http://{PREFIX}-tei-reranking:80/health")

    def wrong_path(docs: list[Manifest]) -> None:
        init = checks.pod_spec(find(docs, "Deployment", "backend"))["initContainers"][0]
        init["args"][0] = init["args"][0].replace("/health", "/info")

    def other_image(docs: list[Manifest]) -> None:
        init = checks.pod_spec(find(docs, "Deployment", "backend"))["initContainers"][0]
        init["image"] = "busybox:1.36"

    def escalating(docs: list[Manifest]) -> None:
        init = checks.pod_spec(find(docs, "Deployment", "backend"))["initContainers"][0]
        init["securityContext"].pop("allowPrivilegeEscalation")

    assert [(p.kind, p.detail) for p in planted(default_docs, removed)] == [
        ("no_startup_wait", f"{PREFIX}-redis:6379"),
        ("no_startup_wait", f"{PREFIX}-tei-embedding:80"),
    ]
    assert kinds(planted(default_docs, needless)) == {"needless_startup_wait"}
    assert kinds(planted(default_docs, wrong_path)) == {"startup_wait_path"}
    assert kinds(planted(default_docs, other_image)) == {"wait_image"}
    assert kinds(planted(default_docs, escalating)) == {"privilege_escalation"}


# --- the start-up wait's script, run on loopback ---------------------------------------------


class Answers:
    """A loopback listener (TCP, or a Unix socket at `path`) that answers each connection's
    first bytes with the next of `replies` (the last one over and over), then closes it; it
    keeps what each connection sent first."""

    def __init__(self, replies: list[bytes], path: Path | None = None) -> None:
        self.replies, self.received = replies, list[bytes]()
        if path is None:
            self.listener = socket.create_server(("127.0.0.1", 0))
            self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        else:
            self.listener = socket.socket(socket.AF_UNIX)
            self.listener.bind(str(path))
            self.listener.listen()
            self.url = str(path)
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed: the test is over
            with connection:
                connection.settimeout(10)
                self.received.append(connection.recv(65536))
                connection.sendall(self.replies[min(len(self.received), len(self.replies)) - 1])
                connection.shutdown(socket.SHUT_WR)
                while connection.recv(65536):  # until the client closes: no reset
                    pass

    def __enter__(self) -> Answers:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept(); close does not
        self.listener.close()
        self.thread.join(timeout=10)


HEALTHY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def run_wait(
    docs: list[Manifest], targets: list[str], monkeypatch: pytest.MonkeyPatch, pace: float = 1
) -> None:
    """The backend's rendered wait script on `targets`, in this process, on a clock that its
    sleeps move on, `pace` times as far as they ask (20 minutes pass without waiting them).
    Raises SystemExit as it exits."""
    found = checks.wait_script(find(docs, "Deployment", "backend"))
    assert found is not None
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds * pace

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(sys, "argv", ["-c", *targets])
    exec(compile(found[0], "wait-for-upstreams", "exec"), {"__name__": "__main__"})


def test_the_wait_outlasts_answers_in_another_protocol_and_ends_when_healthy(
    default_docs: list[Manifest],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A status line that is not HTTP's, then one longer than http.client reads: neither is an
    # OSError. Then TEI's healthy answer: the wait ends, and the pod's container starts.
    replies = [b"SSH-2.0-OpenSSH_9.6\r\n", b"x" * 70_000 + b"\r\n", HEALTHY]
    with Answers(replies) as server:
        run_wait(default_docs, [f"http://{server.url}/health"], monkeypatch)
    assert len(server.received) == 3 and server.received[0].startswith(b"GET /health HTTP/1.1")
    output = capsys.readouterr().out
    assert "BadStatusLine" in output and "LineTooLong" in output


def test_the_wait_outlasts_a_redis_that_answers_garbage_until_its_deadline(
    default_docs: list[Manifest],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A bulk string whose length is not a number: redis-py's parser raises ValueError.
    with Answers([b"$abc\r\n"]) as server, pytest.raises(SystemExit) as exit_:
        run_wait(default_docs, [f"redis://{server.url}"], monkeypatch)
    assert str(exit_.value).startswith(f"redis://{server.url} is still not up after 20 minutes")
    assert "ValueError" in str(exit_.value)
    assert len(server.received) > 100  # every 5 s for 20 minutes, retries aside
    assert all(first.startswith(b"*2\r\n$5\r\nHELLO") for first in server.received)
    assert capsys.readouterr().out.count(f"waiting for redis://{server.url}") > 100


def test_the_wait_takes_rediss_and_unix_urls_for_redis(
    default_docs: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listener says nothing and closes: each attempt fails, the wait ends at its deadline
    # (exit 1 with a message). What it was sent says which client the URL went to. Each
    # sleep of 5 s moves the clock 5 minutes: a TLS client takes a while to set up.
    with Answers([b""]) as server, pytest.raises(SystemExit, match="after 20 minutes"):
        run_wait(default_docs, [f"rediss://{server.url}"], monkeypatch, pace=60)
    assert server.received and server.received[0].startswith(b"\x16\x03")  # a TLS ClientHello
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "redis.sock"
        with Answers([b""], path) as server, pytest.raises(SystemExit, match="after 20 minutes"):
            run_wait(default_docs, [f"unix://{path}"], monkeypatch, pace=60)
    assert server.received and server.received[0].startswith(b"*2\r\n$5\r\nHELLO")


def test_a_wait_script_that_lets_exceptions_through_is_reported(
    default_docs: list[Manifest],
) -> None:
    def narrow(docs: list[Manifest]) -> None:
        init = checks.pod_spec(find(docs, "Deployment", "backend"))["initContainers"][0]
        init["command"][2] = init["command"][2].replace("except Exception", "except OSError")

    def broken(docs: list[Manifest]) -> None:
        init = checks.pod_spec(find(docs, "Deployment", "retriever"))["initContainers"][0]
        init["command"][2] = init["command"][2].replace("    try:", "  try:", 1)

    assert checks.wait_script_problems(default_docs) == []
    assert [(p.kind, p.detail) for p in planted(default_docs, narrow)] == [
        ("wait_script", "an attempt lets exceptions through")
    ]
    (problem,) = planted(default_docs, broken)
    assert problem.kind == "wait_script" and problem.detail.startswith("does not compile")


@pytest.mark.parametrize(
    ("release", "sets"),
    [
        ("r" * checks.LONGEST_RELEASE, {}),
        ("chatqna-" + "r" * (checks.LONGEST_RELEASE - 8), {}),
        (checks.RELEASE, {"fullnameOverride": "f" * 63}),
    ],
)
def test_the_longest_names_leave_statefulsets_room_for_their_revision_label(
    helm: Path, release: str, sets: dict[str, str]
) -> None:
    docs = checks.render(helm, sets=sets, release=release)
    statefulsets = checks.by_kind(docs, "StatefulSet")
    assert len(statefulsets) == 4
    assert max(len(name) for name in statefulsets) == checks.STATEFULSET_NAME_LIMIT
    assert checks.name_length_problems(docs) == []


def test_overlong_names_are_reported(default_docs: list[Manifest]) -> None:
    def longer(docs: list[Manifest]) -> None:
        find(docs, "StatefulSet", "tei-embedding")["metadata"]["name"] = "s" * 53

    def label(docs: list[Manifest]) -> None:
        find(docs, "Service", "redis")["metadata"]["labels"]["app.kubernetes.io/instance"] = (
            "l" * 64
        )

    assert kinds(planted(default_docs, longer)) == {"name_length"}
    assert kinds(planted(default_docs, label)) == {"label_length"}


def test_replicas_and_resources_are_honoured(helm: Path) -> None:
    docs = checks.render(
        helm,
        sets={
            "backend.replicas": 5,
            "retriever.replicas": 3,
            "tei.embedding.replicas": 2,
            "vllm.replicas": 4,
            "backend.resources.requests.cpu": "3",
        },
    )
    assert find(docs, "Deployment", "backend")["spec"]["replicas"] == 5
    assert find(docs, "Deployment", "retriever")["spec"]["replicas"] == 3
    assert find(docs, "StatefulSet", "tei-embedding")["spec"]["replicas"] == 2
    assert find(docs, "StatefulSet", "tei-reranking")["spec"]["replicas"] == 1
    assert find(docs, "StatefulSet", "vllm")["spec"]["replicas"] == 4
    assert container(docs, "Deployment", "backend")["resources"]["requests"]["cpu"] == "3"


def test_settings_from_values_reach_every_chatqna_container(helm: Path) -> None:
    docs = checks.render(helm, sets={"config.MULTI_TURN_MODE": "condense", "config.RRF_K": "30"})
    for component in ("backend", "retriever"):
        settings = settings_of(docs, "Deployment", component)
        assert settings.multi_turn_mode == "condense" and settings.rrf_k == 30


def test_sdk_server_and_proxy_variables_from_values_reach_every_chatqna_container(
    helm: Path,
) -> None:
    """`config` takes the variables the SDK, uvicorn and the HTTP clients read, as compose
    passes them through; a header with a key in it goes in `extraEnv` from a Secret."""
    given = {
        "OTEL_SERVICE_NAME": "chatqna-eu",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=production",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ssl/collector-ca.pem",
        "OTEL_PROPAGATORS": "tracecontext",
        "FORWARDED_ALLOW_IPS": "10.0.0.0/8",
        "HTTP_PROXY": "http://proxy.internal:3128",
        "HTTPS_PROXY": "http://proxy.internal:3128",
        "NO_PROXY": "localhost",
    }
    docs = checks.render(helm, sets={f"config.{key}": value for key, value in given.items()})
    assert checks.manifest_problems(docs) == []
    for component in ("backend", "retriever"):
        workload = find(docs, "Deployment", component)
        env = checks.environment(docs, workload, checks.containers(workload)[0])
        assert {key: env.get(key) for key in given} == given, component


def bypass_of(docs: list[Manifest], component: str) -> list[str | None]:
    """The NO_PROXY and no_proxy a ChatQnA role's container sees."""
    workload = find(docs, "Deployment", component)
    env = checks.environment(docs, workload, checks.containers(workload)[0])
    return [env.get(variable) for variable in checks.PROXY_BYPASS]


def test_the_releases_services_are_never_reached_through_a_proxy(
    helm: Path, embedded_docs: list[Manifest]
) -> None:
    """As the compose stack's default NO_PROXY: with a proxy in `config`, the calls to the
    release's TEI, vLLM, Redis, retriever and collector go direct; so do loopback and every
    in-cluster name."""
    proxy = "http://proxy.internal:3128"
    docs = checks.render(helm, sets={"config.HTTP_PROXY": proxy, "config.HTTPS_PROXY": proxy})
    assert checks.proxy_problems(docs) == checks.proxy_problems(embedded_docs) == []
    for component in ("backend", "retriever"):
        upper, lower = bypass_of(docs, component)
        assert upper == lower and upper is not None, component
        services = [f"{PREFIX}-{name}" for name in ("tei-embedding", "vllm", "victoriatraces")]
        assert {"localhost", "127.0.0.1", ".svc", ".cluster.local", *services} <= set(
            upper.split(",")
        )


def test_an_operators_no_proxy_is_used_as_given_by_both_spellings(helm: Path) -> None:
    docs = checks.render(helm, sets={"config.NO_PROXY": "corp.internal"})
    for component in ("backend", "retriever"):
        assert bypass_of(docs, component) == ["corp.internal"] * 2
    # Then the release's services are the operator's to list; the check names them.
    problems = checks.proxy_problems(docs)
    assert {p.where for p in problems} == {
        f"Deployment/{PREFIX}-{component}:{variable}"
        for component in ("backend", "retriever")
        for variable in checks.PROXY_BYPASS
    }
    backend = next(p for p in problems if p.where == f"Deployment/{PREFIX}-backend:no_proxy")
    for name in ("tei-embedding", "tei-reranking", "vllm", "redis", "victoriatraces"):
        assert f"{PREFIX}-{name}" in backend.detail


def image_environment() -> dict[str, str]:
    """The ENV of the Dockerfile's last stage: what a pod sees unless the chart sets it."""
    from tests.deploy_checks import parse_dockerfile

    instructions = parse_dockerfile((REPO / "Dockerfile").read_text(encoding="utf-8"))
    last = max(i.stage for i in instructions)
    env: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ENV" and instruction.stage == last:
            env.update(word.split("=", 1) for word in shlex.split(instruction.args))
    return env


@pytest.mark.parametrize(
    ("values", "sets", "workers"),
    [
        ((), {}, 1),
        (("values-embedded.yaml",), {}, 1),
        ((), {"config.CHATQNA_WORKERS": "3"}, 3),
    ],
)
def test_the_backend_runs_the_configured_workers_not_one_per_node_core(
    helm: Path, values: tuple[str, ...], sets: dict[str, str], workers: int
) -> None:
    # The image says CHATQNA_WORKERS=auto: one embedded worker per core of the node, as a pod
    # without a CPU limit sees them, would outgrow the pod's memory limit.
    assert image_environment()["CHATQNA_WORKERS"] == "auto"
    docs = checks.render(helm, [CHART / name for name in values], sets=sets)
    workload = find(docs, "Deployment", "backend")
    env = {
        **image_environment(),
        **checks.environment(docs, workload, checks.containers(workload)[0]),
    }
    with pytest.MonkeyPatch.context() as patch:
        for key in Settings.model_fields:
            patch.delenv(key.upper(), raising=False)
        for key, value in env.items():
            if value is not None:
                patch.setenv(key, value)
        assert Settings().worker_count(cores=64) == workers


def test_the_backend_can_search_through_the_retriever_service(helm: Path) -> None:
    docs = checks.render(helm, sets={"backend.useRetrieverService": True})
    backend = settings_of(docs, "Deployment", "backend")
    assert backend.retriever_endpoint == f"http://{PREFIX}-retriever:7000"
    assert checks.url_problems(docs) == []


def test_the_embedded_values_run_the_backend_alone(embedded_docs: list[Manifest]) -> None:
    assert [checks.name_of(w) for w in checks.workloads(embedded_docs)] == [
        f"Deployment/{PREFIX}-backend"
    ]
    backend = settings_of(embedded_docs, "Deployment", "backend")
    assert backend.tei_embedding_endpoint is None and backend.tei_reranking_endpoint is None
    assert backend.llm_endpoint is None and backend.redis_url is None
    assert backend.otel_exporter_otlp_endpoint is None
    workload = find(embedded_docs, "Deployment", "backend")
    assert workload["spec"]["replicas"] == 1
    assert workload["spec"]["strategy"] == {"type": "Recreate"}
    (volume,) = checks.pod_spec(workload)["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == f"{PREFIX}-backend"
    assert f"{PREFIX}-backend" in checks.by_kind(embedded_docs, "PersistentVolumeClaim")


def test_optional_components_are_absent_when_disabled(helm: Path) -> None:
    docs = checks.render(
        helm,
        sets={
            "grafana.enabled": False,
            "victoriametrics.enabled": False,
            "victoriatraces.enabled": False,
            "retriever.enabled": False,
            "tei.reranking.enabled": False,
        },
    )
    names = {checks.name_of(d) for d in docs}
    for component in ("grafana", "victoriametrics", "victoriatraces", "retriever"):
        assert not any(n.split("/")[1].startswith(f"{PREFIX}-{component}") for n in names)
    assert f"StatefulSet/{PREFIX}-tei-reranking" not in names
    backend = settings_of(docs, "Deployment", "backend")
    assert backend.otel_exporter_otlp_endpoint is None and backend.tei_reranking_endpoint is None
    assert checks.manifest_problems(docs) == []


def test_external_model_servers_replace_the_charts_own(helm: Path) -> None:
    docs = checks.render(
        helm,
        sets={
            "vllm.enabled": False,
            "vllm.externalUrl": "https://llm.example.com/v1",
            "vllm.model": "my-model",
            "tei.embedding.enabled": False,
            "tei.embedding.externalUrl": "http://tei.models.svc:80",
        },
    )
    backend = settings_of(docs, "Deployment", "backend")
    assert backend.llm_endpoint == "https://llm.example.com/v1"
    assert backend.llm_model_id == "my-model"
    assert backend.tei_embedding_endpoint == "http://tei.models.svc:80"
    names = {checks.name_of(w) for w in checks.workloads(docs)}
    assert f"StatefulSet/{PREFIX}-vllm" not in names
    assert f"StatefulSet/{PREFIX}-tei-embedding" not in names


def test_backend_replicas_are_drained_one_at_a_time(
    default_docs: list[Manifest], embedded_docs: list[Manifest]
) -> None:
    budget = find(default_docs, "PodDisruptionBudget", "backend")
    assert budget["spec"]["maxUnavailable"] == 1
    selector = find(default_docs, "Deployment", "backend")["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"] == selector
    # One replica: a budget of one unavailable pod would not protect anything.
    assert checks.by_kind(embedded_docs, "PodDisruptionBudget") == {}


def test_pods_run_as_non_root(default_docs: list[Manifest]) -> None:
    for workload in checks.workloads(default_docs):
        assert checks.pod_spec(workload)["automountServiceAccountToken"] is False
        pod = checks.pod_spec(workload)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, checks.name_of(workload)
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    backend = checks.pod_spec(find(default_docs, "Deployment", "backend"))["securityContext"]
    assert backend["runAsUser"] == 10001  # the Dockerfile's user


def test_grafana_is_provisioned_from_deploy_grafana(default_docs: list[Manifest]) -> None:
    dashboards = find(default_docs, "ConfigMap", "grafana-dashboards")["data"]
    source = REPO / "deploy" / "grafana" / "dashboards"
    assert dashboards == {p.name: p.read_text() for p in source.glob("*.json")}
    assert (CHART / "files" / "grafana").resolve() == (REPO / "deploy" / "grafana").resolve()
    provisioning = find(default_docs, "ConfigMap", "grafana-provisioning")["data"]
    datasources = {
        d["uid"]: d["url"] for d in yaml.safe_load(provisioning["datasources.yaml"])["datasources"]
    }
    assert datasources == {
        "chatqna-metrics": f"http://{PREFIX}-victoriametrics:8428",
        "victoriatraces": f"http://{PREFIX}-victoriatraces:10428/select/jaeger",
    }
    scrape = yaml.safe_load(
        find(default_docs, "ConfigMap", "victoriametrics-scrape")["data"]["prometheus.yml"]
    )
    backend, retriever = scrape["scrape_configs"]
    for job, component in ((backend, "backend"), (retriever, "retriever")):
        names = job["dns_sd_configs"][0]["names"]
        assert names == [f"{PREFIX}-{component}-pods.{checks.NAMESPACE}.svc"]
        pods = find(default_docs, "Service", f"{component}-pods")["spec"]
        assert pods["clusterIP"] == "None"
        # Scraped while unready (an upstream outage); clients reach only ready pods.
        assert pods["publishNotReadyAddresses"] is True
        assert "publishNotReadyAddresses" not in find(default_docs, "Service", component)["spec"]
    assert retriever["dns_sd_configs"][0]["port"] == 7000


def notes(helm: Path, *args: str) -> str:
    """The release notes `helm install` prints (a client-side dry run: no cluster)."""
    command = [str(helm), "install", checks.RELEASE, str(CHART), "--dry-run=client"]
    command += ["--namespace", checks.NAMESPACE, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\nNOTES:\n", 1)[1]


def test_the_notes_say_how_to_ingest_and_what_to_secure(helm: Path) -> None:
    text = notes(helm)
    ingest = f"exec deploy/{PREFIX}-backend -- chatqna ingest /opt/chatqna/sample_corpus"
    assert f"kubectl -n {checks.NAMESPACE} {ingest}" in text
    assert "downloads the models" in text and "wait (Init)" in text
    assert "change the admin password" in text and "No API key is set" in text
    embedded = notes(helm, "-f", str(CHART / "values-embedded.yaml"), "--set", "secrets.apiKey=k")
    assert ingest in embedded
    assert "downloads the models" not in embedded and "No API key" not in embedded
    assert "Grafana" not in embedded


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        (("--set", "secrets.existingSecret=chatqna-keys"), False),
        (
            (
                "--set",
                "secrets.existingSecret=chatqna-keys",
                "--set",
                "secrets.existingSecretHasApiKey=false",
            ),
            True,
        ),
        (("--set", "secrets.apiKey=k", "--set", "secrets.existingSecretHasApiKey=false"), False),
    ],
)
def test_the_notes_warn_of_an_open_api_as_the_scraper_sees_it(
    helm: Path, args: tuple[str, ...], warned: bool
) -> None:
    assert ("No API key is set" in notes(helm, *args)) is warned


def test_the_packaged_chart_carries_the_dashboards(helm: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(helm), "package", str(CHART), "--destination", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (package,) = tmp_path.glob("chatqna-*.tgz")
    with tarfile.open(package) as archive:
        member = archive.extractfile("chatqna/files/grafana/dashboards/rag-pipeline.json")
        assert member is not None
        shipped = member.read()
    assert (
        shipped == (REPO / "deploy" / "grafana" / "dashboards" / "rag-pipeline.json").read_bytes()
    )
    assert checks.render(helm, chart=package) == checks.render(helm)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"config.REDIS_URL": "redis://elsewhere:6379"}, "config.REDIS_URL is set by the chart"),
        ({"config.retriever_k": "4"}, "upper-case environment variables"),
        (
            {"redis.enabled": False, "retriever.enabled": False},
            "without Redis the index is embedded",
        ),
        (
            {"redis.enabled": False, "backend.replicas": 1},
            "the retriever service searches Redis",
        ),
        (
            {"retriever.enabled": False, "backend.useRetrieverService": True},
            "needs retriever.enabled=true",
        ),
        ({"redis.externalUrl": "redis://r:6379"}, "redis.externalUrl is used when"),
        # The chart's Redis, its probe and the pods' start-up wait know no password.
        ({"redis.urlSecret.name": "redis-credentials"}, "redis.urlSecret is used when"),
        ({"victoriametrics.enabled": False}, "grafana reads victoriametrics"),
        ({"backend.persistence.enabled": True}, "one ReadWriteOnce volume"),
    ],
)
def test_values_that_cannot_work_fail_the_render(
    helm: Path, sets: dict[str, Any], message: str
) -> None:
    with pytest.raises(checks.RenderError, match=message):
        checks.render(helm, sets=sets)


# --- planted mistakes in rendered manifests are reported -------------------------------------


def planted(docs: list[Manifest], mutate: Callable[[list[Manifest]], None]) -> list[checks.Problem]:
    """What a mutation of a copy of `docs` adds to their own problems."""
    before = checks.manifest_problems(docs)
    changed = copy.deepcopy(docs)
    mutate(changed)
    return [p for p in checks.manifest_problems(changed) if p not in before]


def pick(docs: list[Manifest], kind: str, component: str) -> dict[str, Any]:
    return container(docs, kind, component)


def test_an_unknown_field_fails_the_schema(default_docs: list[Manifest]) -> None:
    def mutate(docs: list[Manifest]) -> None:
        pick(docs, "Deployment", "backend")["readinessProbe"]["httpGett"] = {"path": "/"}

    problems = planted(default_docs, mutate)
    assert "schema" in kinds(problems)
    assert any("httpGett" in p.detail for p in problems)


def test_a_wrong_type_fails_the_schema(default_docs: list[Manifest]) -> None:
    def mutate(docs: list[Manifest]) -> None:
        find(docs, "Deployment", "backend")["spec"]["replicas"] = "two"

    problems = planted(default_docs, mutate)
    assert kinds(problems) == {"schema"}
    assert problems[0].where.endswith("spec.replicas")


@pytest.mark.parametrize(
    ("mutate", "kind"),
    [
        (lambda d: pick(d, "StatefulSet", "vllm").pop("readinessProbe"), "missing_probe"),
        (
            lambda d: pick(d, "StatefulSet", "tei-embedding")["livenessProbe"]["httpGet"].update(
                port=9999
            ),
            "probe_port",
        ),
        (
            lambda d: pick(d, "Deployment", "backend")["readinessProbe"]["httpGet"].update(
                path="/v1/health_check"
            ),
            "probe_path",
        ),
        (
            lambda d: pick(d, "Deployment", "retriever")["livenessProbe"]["httpGet"].update(
                path="/health"
            ),
            "probe_path",
        ),
    ],
)
def test_probe_mistakes_are_reported(
    default_docs: list[Manifest], mutate: Callable[[list[Manifest]], Any], kind: str
) -> None:
    assert kinds(planted(default_docs, mutate)) == {kind}


def test_a_role_listening_off_its_port_is_reported(default_docs: list[Manifest]) -> None:
    def mutate(docs: list[Manifest]) -> None:
        entry = env_entry(pick(docs, "Deployment", "backend"), "MEGA_SERVICE_PORT")
        assert entry is not None
        entry["value"] = "9000"

    # The process would listen on 9000: no declared port, and the probes and scraper miss it.
    assert kinds(planted(default_docs, mutate)) == {"role_port", "probe_port", "not_scraped"}


def test_an_unknown_setting_is_reported(default_docs: list[Manifest]) -> None:
    def in_configmap(docs: list[Manifest]) -> None:
        find(docs, "ConfigMap", "settings")["data"]["RETRIEVER_TOP_K"] = "4"

    def in_env(docs: list[Manifest]) -> None:
        pick(docs, "Deployment", "backend")["env"].append({"name": "LLM_MODEL", "value": "x"})

    assert {(p.kind, p.detail) for p in planted(default_docs, in_configmap)} == {
        ("unknown_setting", "RETRIEVER_TOP_K")
    }
    assert {(p.kind, p.detail) for p in planted(default_docs, in_env)} == {
        ("unknown_setting", "LLM_MODEL")
    }


def test_a_secret_outside_a_secret_is_reported(default_docs: list[Manifest]) -> None:
    def literal(docs: list[Manifest]) -> None:
        pick(docs, "Deployment", "backend")["env"].append(
            {"name": "CHATQNA_API_KEY", "value": "plain"}
        )

    def in_configmap(docs: list[Manifest]) -> None:
        find(docs, "ConfigMap", "settings")["data"]["OPENAI_API_KEY"] = "plain"

    assert kinds(planted(default_docs, literal)) == {"plain_secret"}
    assert kinds(planted(default_docs, in_configmap)) == {"plain_secret"}


@pytest.mark.parametrize(
    ("mutate", "kind"),
    [
        (
            lambda d: checks.pod_spec(find(d, "StatefulSet", "redis"))["securityContext"].update(
                runAsNonRoot=False
            ),
            "root",
        ),
        (
            lambda d: pick(d, "Deployment", "grafana").__setitem__(
                "securityContext", {"runAsUser": 0, "allowPrivilegeEscalation": False}
            ),
            "root",
        ),
        (
            lambda d: checks.pod_spec(find(d, "Deployment", "backend")).pop(
                "automountServiceAccountToken"
            ),
            "service_account_token",
        ),
        (
            lambda d: pick(d, "StatefulSet", "vllm")["securityContext"].pop(
                "allowPrivilegeEscalation"
            ),
            "privilege_escalation",
        ),
        (
            lambda d: pick(d, "Deployment", "backend")["resources"]["requests"].pop("cpu"),
            "no_requests",
        ),
        (
            lambda d: pick(d, "Deployment", "retriever")["resources"].pop("limits"),
            "no_memory_limit",
        ),
    ],
)
def test_security_and_resource_mistakes_are_reported(
    default_docs: list[Manifest], mutate: Callable[[list[Manifest]], Any], kind: str
) -> None:
    assert kinds(planted(default_docs, mutate)) == {kind}


def test_a_url_to_no_service_or_the_wrong_port_is_reported(default_docs: list[Manifest]) -> None:
    def typo(docs: list[Manifest]) -> None:
        data = find(docs, "ConfigMap", "settings")["data"]
        data["TEI_EMBEDDING_ENDPOINT"] = f"http://{PREFIX}-tei-embeding:80"

    def port(docs: list[Manifest]) -> None:
        entry = env_entry(pick(docs, "Deployment", "backend"), "LLM_ENDPOINT")
        assert entry is not None
        entry["value"] = f"http://{PREFIX}-vllm:8000/v1"  # the pod's port, not the Service's

    # The pods still wait for the Service the URL should have named.
    assert kinds(planted(default_docs, typo)) == {"unknown_service", "needless_startup_wait"}
    assert kinds(planted(default_docs, port)) == {"wrong_port"}


def test_services_and_references_that_miss_are_reported(default_docs: list[Manifest]) -> None:
    def selector(docs: list[Manifest]) -> None:
        labels = find(docs, "Service", "redis")["spec"]["selector"]
        labels["app.kubernetes.io/component"] = "rediss"

    def budget(docs: list[Manifest]) -> None:
        labels = find(docs, "PodDisruptionBudget", "backend")["spec"]["selector"]["matchLabels"]
        labels["app.kubernetes.io/instance"] = "other"

    def target(docs: list[Manifest]) -> None:
        find(docs, "Service", "grafana")["spec"]["ports"][0]["targetPort"] = "web"

    def dangling(docs: list[Manifest]) -> None:
        source = pick(docs, "Deployment", "retriever")["envFrom"][0]
        source["configMapRef"]["name"] = f"{PREFIX}-setings"

    assert kinds(planted(default_docs, selector)) == {"selects_nothing"}
    assert kinds(planted(default_docs, budget)) == {"selects_nothing"}
    assert kinds(planted(default_docs, target)) == {"target_port"}
    assert "dangling_reference" in kinds(planted(default_docs, dangling))


def test_grafana_drift_from_deploy_is_reported(default_docs: list[Manifest]) -> None:
    def dashboard(docs: list[Manifest]) -> None:
        data = find(docs, "ConfigMap", "grafana-dashboards")["data"]
        data["rag-pipeline.json"] = data["rag-pipeline.json"].replace("RAG", "Rag", 1)

    def extra(docs: list[Manifest]) -> None:
        find(docs, "ConfigMap", "grafana-dashboards")["data"]["old.json"] = "{}"

    def datasource(docs: list[Manifest]) -> None:
        data = find(docs, "ConfigMap", "grafana-provisioning")["data"]
        data["datasources.yaml"] = data["datasources.yaml"].replace("chatqna-metrics", "metrics")

    assert kinds(planted(default_docs, dashboard)) == {"dashboard_drift"}
    assert kinds(planted(default_docs, extra)) == {"dashboard_drift"}
    assert kinds(planted(default_docs, datasource)) == {"datasource_drift"}


# --- the chart's files ---------------------------------------------------------------------


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def test_every_top_level_value_is_documented() -> None:
    readme = (CHART / "README.md").read_text()
    documented = checks.documented_keys(readme)
    for key in chart_values():
        assert any(d == key or d.startswith(f"{key}.") for d in documented), key
    assert checks.values_doc_problems(chart_values(), readme) == []


def test_undocumented_and_stale_values_are_reported() -> None:
    readme = (CHART / "README.md").read_text()
    values = {**chart_values(), "ingress": {"enabled": False}}
    assert {(p.kind, p.detail) for p in checks.values_doc_problems(values, readme)} == {
        ("undocumented_value", "ingress")
    }
    stale = readme + "| `backend.hpa.enabled` | `false` | Autoscaling. |\n"
    assert {(p.kind, p.detail) for p in checks.values_doc_problems(chart_values(), stale)} == {
        ("stale_value_doc", "backend.hpa.enabled")
    }


def test_config_keys_are_settings_with_the_documented_defaults() -> None:
    env_example = (REPO / ".env.example").read_text()
    known = checks.container_variables()
    assert set(chart_values()["config"]) <= known
    assert checks.config_problems(chart_values(), env_example) == []
    values = chart_values()
    values["config"] = {**values["config"], "RETRIEVER_TOPK": "4", "RETRIEVER_K": "8"}
    assert {(p.kind, p.where) for p in checks.config_problems(values, env_example)} == {
        ("unknown_setting", "values.yaml:config"),
        ("default_mismatch", "values.yaml:config.RETRIEVER_K"),
    }


def broken_chart(tmp_path: Path, template: str, text: str) -> Path:
    chart = tmp_path / "chatqna"
    shutil.copytree(CHART, chart, symlinks=False)
    (chart / "templates" / template).write_text(text)
    return chart


def test_a_template_that_does_not_render_is_reported(helm: Path, tmp_path: Path) -> None:
    chart = broken_chart(tmp_path, "broken.yaml", "{{ .Values.backend.nope.deeper }}\n")
    problems = checks.chart_problems(helm, chart)
    assert "render" in kinds(problems) and "lint" in kinds(problems)
    assert any("nil pointer" in p.detail for p in problems if p.kind == "render")


def test_a_manifest_the_schema_rejects_is_reported_by_the_whole_check(
    helm: Path, tmp_path: Path
) -> None:
    bad = "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  portz: []\n"
    chart = broken_chart(tmp_path, "bad.yaml", bad)
    problems = checks.chart_problems(helm, chart)
    assert {p.where for p in problems if p.kind == "schema"} == {
        f"{name}:Service/x:spec" for name in ("values.yaml", *checks.VALUES_FILES)
    }
