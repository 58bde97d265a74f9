"""Load benchmark: N concurrent streaming multi-turn chats against a real ChatQnA server process.

    .venv/bin/python benchmarks/load_chats.py [--concurrency 200] [--duration 30]
        [--runs 2] [--warmup 60] [--pause 5] [--delay 0.02] [--tokens 20]
        [--token-interval 0.02] [--workers N --remote-retriever] [--configuration NAME]

Starts the stand-in TEI + OpenAI upstreams (`python -m tests.standins.servers`, their own
process) and `python -m chatqna serve` on loopback with the embedded index in a temporary
data dir, blend on, tracing off, access log off (log level WARNING), and ingests the sample
corpus. Then `--concurrency` virtual users each run conversations from the handbook lab for
`--duration` seconds: the first question, then its follow-up with the streamed answer as
history, each a streaming `POST /v1/chatqna`. A user starts no new chat after the deadline;
chats in flight finish and count. A warm-up run at full concurrency (`--warmup` seconds,
reported but not counted) brings the server to its working size, which it reaches after a
few thousand chats at the defaults. Then `--runs`
runs follow each other against the same server process, `--pause` idle seconds apart, with
the server's RSS sampled from /proc throughout and once more at the end of each pause
("settled": the server is idle, its idle connections expired). Growth across runs shows in
the settled RSS.

With `--remote-retriever` the server searches the stand-in's OPEA retriever instead of the
embedded index. With `--workers` above 1, RSS and CPU are the sums over the server's
processes.

Per run: chats/s, time to the first SSE event (metadata) and to the first token, p50/p95/p99
of the whole chat, errors by kind, the server's RSS (start, end, peak, settled) and CPU time.
Prints a table, the settled RSS growth from run to run and its trend (least-squares MiB per
run, from three runs), and writes JSON to `results/load_chats.json` (with `--configuration`,
as that named run beside the file's others) unless `--output` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from chatqna.upstream.sse import ServerSentEvent, SSEDecoder  # noqa: E402
from tests.integration.conftest import SAMPLE_CORPUS, clean_env  # noqa: E402
from tests.standins.servers import free_port  # noqa: E402

CONVERSATIONS = REPO / "benchmarks" / "datasets" / "handbook-lab" / "conversations.jsonl"
DEFAULT_OUTPUT = Path(__file__).parent / "results" / "load_chats.json"


# --- processes --------------------------------------------------------------------------


@dataclass
class Process:
    """A child process on loopback; `stop()` ends it (terminate, then kill)."""

    name: str
    url: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_process(
    name: str,
    argv: Sequence[str],
    env: dict[str, str],
    port: int,
    log_dir: Path,
    *,
    ready_path: str,
    cpus: str | None = None,
    timeout: float = 90.0,
) -> Process:
    """Start `argv` (pinned to `cpus` with taskset if given) and wait for `ready_path` → 200."""
    command = [*(["taskset", "-c", cpus] if cpus else []), *argv]
    log_path = log_dir / f"{name}.log"
    popen = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT
    )
    process = Process(name, f"http://127.0.0.1:{port}", popen, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{name} exited early:\n{process.log_tail()}")
        try:
            if httpx.get(process.url + ready_path, timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.stop()
    raise RuntimeError(f"{name} not ready in {timeout:.0f}s:\n{process.log_tail()}")


STANDINS = "tests.standins.servers"  # the FastAPI stand-ins; `.fast_servers` is the cheap one


def standin_options(module: str = STANDINS) -> set[str]:
    """The options `python -m <module>` accepts today (read from its --help)."""
    shown = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {word.rstrip(",") for word in shown.split() if word.startswith("--")}


def standin_argv(
    port: int, options: dict[str, float | int | None], module: str = STANDINS
) -> list[str]:
    """Arguments for the stand-in process (`python -m <module>`); an option it does not know
    is a clear error."""
    known = standin_options(module)
    argv = [sys.executable, "-m", module, "--port", str(port)]
    for name, value in options.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if flag not in known:
            raise SystemExit(f"{module} has no {flag} option (it has {sorted(known)})")
        argv += [flag, str(value)]
    return argv


def orchestrator_env() -> dict[str, str]:
    """The parent environment without ChatQnA's variables and without proxies."""
    env = clean_env()
    for name in list(env):
        if name.lower().endswith("_proxy"):
            del env[name]
    return env


def start_upstreams(
    root: Path, options: dict[str, float | int | None], module: str, cpus: str | None = None
) -> Process:
    """The stand-in upstreams (`python -m <module>`) on a free port, pinned to `cpus`."""
    port = free_port()
    argv = standin_argv(port, options, module)
    return start_process(
        "upstreams", argv, orchestrator_env(), port, root, ready_path="/health", cpus=cpus
    )


def start_receiver(root: Path, cpus: str | None = None) -> Process:
    """An OTLP/HTTP receiver (`tests/integration/otlp_receiver.py`) on a free port, pinned
    to `cpus`: where the traced benchmarks export their spans."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.integration.otlp_receiver", str(port)]
    env = orchestrator_env()
    return start_process("receiver", argv, env, port, root, ready_path="/", cpus=cpus)


def start_remote_chatqna(
    name: str, upstream: str, root: Path, env: dict[str, str], cpus: str | None = None
) -> Process:
    """`chatqna serve` with every backend remote on the stand-in at `upstream` (TEI, the OPEA
    retriever, the LLM), access log off; `env` adds or overrides variables (tracing)."""
    port = free_port()
    return start_process(
        name,
        [sys.executable, "-m", "chatqna", "serve"],
        {
            **orchestrator_env(),
            "MEGA_SERVICE_PORT": str(port),
            "CHATQNA_HOST": "127.0.0.1",
            "CHATQNA_DATA_DIR": str(root / "data"),
            "CHATQNA_LOG_LEVEL": "WARNING",  # uvicorn's access log is INFO
            "TEI_EMBEDDING_ENDPOINT": upstream,
            "TEI_RERANKING_ENDPOINT": upstream,
            "RETRIEVER_ENDPOINT": upstream,
            "LLM_ENDPOINT": upstream,
            "LLM_MODEL_ID": "standin",
            **env,
        },
        port,
        root,
        ready_path="/v1/ready",
        cpus=cpus,
    )


def server_env(
    standin: str,
    data_dir: Path,
    port: int,
    concurrency: int,
    workers: int = 1,
    remote_retriever: bool = False,
) -> dict[str, str]:
    """ChatQnA's environment: stand-in upstreams, blend on, tracing and access log off;
    with `remote_retriever`, the stand-in's OPEA retriever instead of the embedded index."""
    from chatqna.settings import Settings

    env = clean_env(
        MEGA_SERVICE_PORT=str(port),
        CHATQNA_HOST="127.0.0.1",
        CHATQNA_DATA_DIR=str(data_dir),
        CHATQNA_LOG_LEVEL="WARNING",  # uvicorn's access log is INFO: WARNING keeps it quiet
        TEI_EMBEDDING_ENDPOINT=standin,
        TEI_RERANKING_ENDPOINT=standin,
        LLM_ENDPOINT=standin,
        LLM_MODEL_ID="standin",
        MULTI_TURN_BLEND_ENABLED="true",
        OTEL_TRACES_EXPORTER="none",
    )
    env["CHATQNA_WORKERS"] = str(workers)
    if remote_retriever:
        env["RETRIEVER_ENDPOINT"] = standin
    # A limit on chats in flight (answering 429 when saturated) must admit every virtual user.
    for name, info in Settings.model_fields.items():
        if info.annotation in (int, int | None) and any(
            part in name for part in ("concurren", "in_flight", "inflight")
        ):
            env[name.upper()] = str(max(2 * concurrency, 256))
    return env


def upload_corpus(url: str) -> None:
    files = [
        ("files", (path.name, path.read_bytes(), "text/markdown"))
        for path in sorted(SAMPLE_CORPUS.glob("*.md"))
    ]
    httpx.post(f"{url}/v1/dataprep/ingest", files=files, timeout=120).raise_for_status()


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (a server's worker processes), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _own_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def rss_kib(pid: int) -> int:
    """Resident set size of `pid` and its children (workers) in KiB, from /proc."""
    total = _own_rss_kib(pid)
    for child in child_pids(pid):
        with suppress(OSError, RuntimeError):
            total += _own_rss_kib(child)
    return total


def _own_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time `pid` and its live children (workers) have used, from /proc."""
    total = _own_cpu_seconds(pid)
    for child in child_pids(pid):
        with suppress(OSError):
            total += _own_cpu_seconds(child)
    return total


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def slope(values: Sequence[float]) -> float | None:
    """Least-squares slope of `values` against their index; None for fewer than three."""
    if len(values) < 3:
        return None
    mean_x = (len(values) - 1) / 2
    mean_y = sum(values) / len(values)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values))
    variance = sum((x - mean_x) ** 2 for x in range(len(values)))
    return covariance / variance


def summarise(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{p}": percentile(values, p) for p in (50, 95, 99)}


# --- one streamed chat -------------------------------------------------------------------


@dataclass
class ChatResult:
    """What one streamed chat took, or why it failed (`error` is the kind)."""

    latency_ms: float
    first_event_ms: float | None = None
    first_token_ms: float | None = None
    answer: str = ""
    error: str | None = None
    detail: str = ""


def error_kind(exc: Exception) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return "disconnected"
    return type(exc).__name__


class SSEReader:
    """Reads ChatQnA's SSE events: times the first event and first token, keeps the answer.

    It feeds raw network reads to the shared `SSEDecoder`: the load generator shares the
    machine with the server, and the decoder costs a microsecond or two per event, no more
    than httpx's line iterator (see `sse_parsing.py` beside this file).
    """

    def __init__(self, result: ChatResult, started: float) -> None:
        self.result = result
        self.started = started
        self.pieces: list[str] = []
        self.done = False
        self.decoder = SSEDecoder()

    def feed_bytes(self, chunk: bytes) -> None:
        for event in self.decoder.feed(chunk):
            self.feed_event(event)

    def feed_event(self, event: ServerSentEvent) -> None:
        now_ms = (time.perf_counter() - self.started) * 1000
        if self.result.first_event_ms is None:
            self.result.first_event_ms = now_ms
        if event.is_done:
            self.done = True
        elif event.event == "error":
            self.result.error = "sse_error:" + str(json.loads(event.data).get("error"))
        elif event.event == "message":
            delta = json.loads(event.data)["choices"][0]["delta"].get("content")
            if delta:
                if self.result.first_token_ms is None:
                    self.result.first_token_ms = now_ms
                self.pieces.append(delta)


async def stream_chat(client: httpx.AsyncClient, messages: list[dict[str, str]]) -> ChatResult:
    """POST one streaming chat and read its SSE events, timing the first event and token."""
    started = time.perf_counter()
    result = ChatResult(latency_ms=0.0)
    reader = SSEReader(result, started)
    try:
        async with client.stream(
            "POST", "/v1/chatqna", json={"messages": messages, "stream": True}
        ) as response:
            if response.status_code != 200:
                await response.aread()
                result.error = f"http_{response.status_code}"
            else:
                async for chunk in response.aiter_raw():
                    reader.feed_bytes(chunk)
                if result.error is None and not reader.done:
                    result.error = "incomplete_stream"
    except Exception as exc:  # every failure is counted by kind, none ends the run
        result.error = error_kind(exc)
        result.detail = f"{type(exc).__name__}: {exc}"[:200]
    result.latency_ms = (time.perf_counter() - started) * 1000
    result.answer = "".join(reader.pieces)
    return result


def load_conversations(path: Path = CONVERSATIONS) -> list[tuple[str, str]]:
    """(question, follow-up) pairs: each conversation's first two user turns."""
    pairs = []
    for line in path.read_text().splitlines():
        users = [t["text"] for t in json.loads(line)["turns"] if t["role"] == "user"]
        if len(users) >= 2:
            pairs.append((users[0], users[1]))
    return pairs


# --- one run -----------------------------------------------------------------------------


@dataclass
class RunRecord:
    """Everything one run observed, before it is summarised."""

    results: list[ChatResult] = field(default_factory=list)
    conversations: int = 0
    rss_samples: list[tuple[float, int]] = field(default_factory=list)


async def sample_rss(pid: int, record: RunRecord, started: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        record.rss_samples.append((time.perf_counter() - started, rss_kib(pid)))
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.25)
    record.rss_samples.append((time.perf_counter() - started, rss_kib(pid)))


async def virtual_user(
    client: httpx.AsyncClient,
    pairs: list[tuple[str, str]],
    offset: int,
    start_at: float,
    deadline: float,
    record: RunRecord,
) -> None:
    """Conversations back to back until the deadline: a question, then its follow-up."""
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    index = offset
    while time.perf_counter() < deadline:
        question, follow_up = pairs[index % len(pairs)]
        index += 1
        first = await stream_chat(client, [{"role": "user", "content": question}])
        record.results.append(first)
        if first.error is not None or time.perf_counter() >= deadline:
            continue
        history = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": first.answer},
            {"role": "user", "content": follow_up},
        ]
        second = await stream_chat(client, history)
        record.results.append(second)
        if second.error is None:
            record.conversations += 1


def client_for(url: str, concurrency: int, timeout: float) -> httpx.AsyncClient:
    """A pool with a connection per user. Idle connections expire well before uvicorn's 5 s
    keep-alive: at an equal expiry a request can be sent on a connection the server is
    closing at that moment, which fails with no response (a client race, not a server fault).
    """
    return httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(timeout, connect=10.0),
        limits=httpx.Limits(
            max_connections=concurrency + 8,
            max_keepalive_connections=concurrency,
            keepalive_expiry=2.0,
        ),
    )


async def one_run(
    url: str, pid: int, pairs: list[tuple[str, str]], args: argparse.Namespace, duration: float
) -> dict[str, Any]:
    record = RunRecord()
    stop = asyncio.Event()
    cpu_before = cpu_seconds(pid)
    loadgen_before = time.process_time()
    load_before = load_average()
    async with client_for(url, args.concurrency, args.timeout) as client:
        started = time.perf_counter()
        sampler = asyncio.create_task(sample_rss(pid, record, started, stop))
        deadline = started + args.ramp + duration
        users = [
            virtual_user(
                client,
                pairs,
                offset=i,
                start_at=started + args.ramp * i / args.concurrency,
                deadline=deadline,
                record=record,
            )
            for i in range(args.concurrency)
        ]
        await asyncio.gather(*users)
        elapsed = time.perf_counter() - started
        stop.set()
        await sampler
    cpu = (cpu_seconds(pid) - cpu_before, time.process_time() - loadgen_before)
    await asyncio.sleep(args.pause)  # idle: connections expire
    settled = rss_kib(pid)
    return summarise_run(record, elapsed, cpu, load_before, settled)


def summarise_run(
    record: RunRecord,
    elapsed: float,
    cpu: tuple[float, float],
    load_before: list[float],
    settled_kib: int,
) -> dict[str, Any]:
    ok = [r for r in record.results if r.error is None]
    errors = Counter(r.error for r in record.results if r.error is not None)
    rss = [kib for _, kib in record.rss_samples]
    # Chats are started over `elapsed` minus the ramp-up, but all of them count.
    return {
        "chats": len(record.results),
        "chats_ok": len(ok),
        "conversations_ok": record.conversations,
        "elapsed_s": round(elapsed, 2),
        "chats_per_s": round(len(ok) / elapsed, 2),
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
        "error_examples": _examples(record.results),
        "first_event_ms": _rounded(summarise([r.first_event_ms for r in ok if r.first_event_ms])),
        "first_token_ms": _rounded(summarise([r.first_token_ms for r in ok if r.first_token_ms])),
        "latency_ms": _rounded(summarise([r.latency_ms for r in ok])),
        "server_rss_mib": {
            "start": round(rss[0] / 1024, 1),
            "end": round(rss[-1] / 1024, 1),
            "peak": round(max(rss) / 1024, 1),
            "settled": round(settled_kib / 1024, 1),
        },
        "server_rss_samples_mib": [
            [round(t, 2), round(kib / 1024, 1)] for t, kib in record.rss_samples
        ][:: max(1, len(record.rss_samples) // 120)],
        "server_cpu_s": round(cpu[0], 2),
        "server_cpu_share": round(cpu[0] / elapsed, 2),
        # Near 1.0, the load generator (one process) limits the run rather than the server.
        "loadgen_cpu_share": round(cpu[1] / elapsed, 2),
        "load_average_before": load_before,
    }


def _examples(results: Sequence[ChatResult], per_kind: int = 3) -> dict[str, list[str]]:
    examples: dict[str, list[str]] = {}
    for result in results:
        if result.error is not None and result.detail:
            kept = examples.setdefault(result.error, [])
            if len(kept) < per_kind and result.detail not in kept:
                kept.append(result.detail)
    return examples


def _rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 1) for k, v in values.items()}


# --- report ------------------------------------------------------------------------------


def print_table(
    warmup: dict[str, Any] | None, runs: list[dict[str, Any]], args: argparse.Namespace
) -> None:
    print(
        f"{args.concurrency} concurrent streaming chats (question + follow-up, blend on), "
        f"{args.duration:.0f} s per run, stand-ins: delay {args.delay} s, {args.tokens} tokens "
        f"{args.token_interval} s apart"
    )
    print(
        "| run | chats | chats/s | first event p50/p95/p99 ms | first token p50/p95/p99 ms "
        "| latency p50/p95/p99 ms | errors | RSS start/end/peak/settled MiB | server CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = [("warm-up", warmup)] if warmup is not None else []
    rows += [(str(number), run) for number, run in enumerate(runs, start=1)]
    for number, run in rows:
        fe, ft, lat, rss = (
            run["first_event_ms"],
            run["first_token_ms"],
            run["latency_ms"],
            run["server_rss_mib"],
        )
        errors = run["errors"] if not run["errors"] else f"{run['errors']} {run['errors_by_kind']}"
        print(
            f"| {number} | {run['chats']} | {run['chats_per_s']:.1f} "
            f"| {_triple(fe)} | {_triple(ft)} | {_triple(lat)} | {errors} "
            f"| {rss['start']:.1f}/{rss['end']:.1f}/{rss['peak']:.1f}/{rss['settled']:.1f} "
            f"| {run['server_cpu_share']:.0%} |"
        )


def _triple(values: dict[str, float | None]) -> str:
    return "/".join("-" if values[k] is None else f"{values[k]:.0f}" for k in ("p50", "p95", "p99"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=200, help="virtual users")
    parser.add_argument("--duration", type=float, default=30, help="seconds per run")
    parser.add_argument("--runs", type=int, default=2, help="runs against the same server")
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds to start all users")
    parser.add_argument(
        "--pause", type=float, default=5.0, help="idle seconds after each run (then: settled RSS)"
    )
    parser.add_argument(
        "--warmup", type=float, default=60.0, help="seconds of the uncounted warm-up run (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=120, help="client timeout per chat")
    parser.add_argument("--delay", type=float, default=0.02, help="stand-in delay per call (s)")
    parser.add_argument("--tokens", type=int, default=20, help="tokens per streamed answer")
    parser.add_argument(
        "--token-interval", type=float, default=0.02, help="seconds between streamed tokens"
    )
    parser.add_argument("--workers", type=int, default=1, help="server processes (CHATQNA_WORKERS)")
    parser.add_argument(
        "--remote-retriever",
        action="store_true",
        help="the stand-in retriever (RETRIEVER_ENDPOINT) instead of the embedded index",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--configuration", help="write the run as this named configuration of --output"
    )
    args = parser.parse_args(argv)
    return args


@contextmanager
def running_services(args: argparse.Namespace, root: Path) -> Iterator[tuple[Process, Process]]:
    """The stand-in upstreams and the ChatQnA server, stopped on exit."""
    started: list[Process] = []
    try:
        port = free_port()
        standin_opts = {
            "delay": args.delay,
            "tokens": args.tokens,
            "token_interval": args.token_interval,
        }
        standin = start_process(
            "standins",
            standin_argv(port, standin_opts),
            clean_env(),
            port,
            root,
            ready_path="/health",
        )
        started.append(standin)
        port = free_port()
        server = start_process(
            "chatqna",
            [sys.executable, "-m", "chatqna", "serve"],
            server_env(
                standin.url,
                root / "data",
                port,
                args.concurrency,
                args.workers,
                args.remote_retriever,
            ),
            port,
            root,
            ready_path="/v1/ready",
        )
        started.append(server)
        yield standin, server
    finally:
        for process in reversed(started):
            process.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from provenance import start_run, write_result  # the sibling script, imported where it is run

    start_run()
    pairs = load_conversations()
    with tempfile.TemporaryDirectory() as tmp, running_services(args, Path(tmp)) as (_, server):
        if not args.remote_retriever:
            upload_corpus(server.url)
        warmup = None
        if args.warmup > 0:
            warmup = asyncio.run(one_run(server.url, server.pid, pairs, args, args.warmup))
        runs = [
            asyncio.run(one_run(server.url, server.pid, pairs, args, args.duration))
            for _ in range(args.runs)
        ]
        print_table(warmup, runs, args)
        if server.popen.poll() is not None:
            raise SystemExit(f"the server died during the run:\n{server.log_tail()}")
        server_log = server.log_tail(20)
    ends = [run["server_rss_mib"]["end"] for run in runs]
    settled = [run["server_rss_mib"]["settled"] for run in runs]
    growth = [round(after - before, 1) for before, after in itertools.pairwise(settled)]
    print(f"server RSS at the end of each run (MiB): {ends}")
    print(f"server RSS settled after each run (MiB): {settled}")
    print(f"settled RSS growth from run to run (MiB): {growth}")
    trend = slope(settled)
    if trend is not None:
        print(f"settled RSS trend (MiB per run, least squares): {trend:+.2f}")
    report = {
        "benchmark": "load_chats",
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "ramp_s": args.ramp,
        "standins": {
            "delay_s": args.delay,
            "tokens": args.tokens,
            "token_interval_s": args.token_interval,
        },
        "warmup_s": args.warmup,
        "pause_s": args.pause,
        "server": {
            "multi_turn_blend_enabled": True,
            "tracing": "off",
            "log_level": "WARNING",
            "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
            "workers": args.workers,
            "retriever": "stand-in (RETRIEVER_ENDPOINT)" if args.remote_retriever else "embedded",
        },
        "load_average_after": load_average(),
        "warmup": warmup,
        "runs": runs,
        "rss_end_mib_by_run": ends,
        "rss_settled_mib_by_run": settled,
        "rss_settled_growth_mib": growth,
        "rss_settled_trend_mib_per_run": None if trend is None else round(trend, 3),
        "server_log_tail": server_log,
    }

    command = None if argv is None else [sys.argv[0], *argv]
    write_result(args.output, report, configuration=args.configuration, argv=command)
    print(f"wrote {args.output}")
    return 1 if any(run["errors"] for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
