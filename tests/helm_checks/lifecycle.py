"""How ChatQnA pods start and stop: the wait for upstreams, the preStop sleep, the grace period."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from urllib.parse import urlsplit

from tests.deploy_checks import Problem
from tests.helm_checks.helm import NAMESPACE
from tests.helm_checks.manifests import (
    Manifest,
    by_kind,
    containers,
    environment,
    is_chatqna,
    name_of,
    pod_spec,
    workloads,
)


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
