"""What the megaservice costs on top of its upstreams: ChatQnA vs OPEA's orchestrator, one run.

    benchmarks/opea/setup-venv          # once: opea-comps in .cache/opea-venv
    .venv/bin/python benchmarks/opea_overhead.py [--seconds 10] [--rounds 1]
        [--standins fast|app]

Starts one stand-in process with all four upstreams (TEI embeddings and rerank, an OpenAI
chat server streaming `--tokens` tokens, an OPEA `/v1/retrieval` retriever), then two
orchestrators in front of the same stand-ins: `chatqna serve` with `RETRIEVER_ENDPOINT`
pointing at the stand-in retriever, and OPEA's `ServiceOrchestrator` running the EMBEDDING
-> RETRIEVER -> RERANK -> LLM graph (`opea/megaservice.py`, in its own venv). Both are
pinned to `--orchestrator-cpu` (taskset), the stand-ins and this load generator to
`--client-cpu`; both run with tracing and the access log off. With `--traced`, a third
system joins the rotation: `chatqna serve` sampling 10% of traces
(`parentbased_traceidratio`) and exporting them over OTLP/HTTP to a receiver on loopback
(`tests/integration/otlp_receiver.py`, on the client core), measured against OPEA untraced.

The client side must not be what limits requests/s, so by default the stand-ins are
`python -m tests.standins.fast_servers` (`--standins fast`: HTTP/1.1 on httptools, the same
bytes as the FastAPI stand-ins for about a tenth of their CPU); `--standins app` runs the
FastAPI stand-ins (`python -m tests.standins.servers`) instead. The load generator is an
`aiohttp.ClientSession` on uvloop (a keep-alive connection per worker, a 60 s timeout per
request; aiohttp costs the caller the least CPU per call of the clients
`http_client_cost.py` compares), sending the same compact JSON bodies to both systems. The
orchestrator's CPU per request is read from its own process, so the load generator's cost
does not enter it; requests/s and latency do include the load generator's time, for both
systems alike, which pulls their ratio toward 1 at one request in flight. Each point
records `client_core_share`, the client core's busy share (stand-ins plus load generator):
near 1.0, the client limits.

Each point (stream and non-stream, at each `--concurrency`) is a closed loop of the same
single-turn requests for `--seconds`, after a warm-up, with the two systems alternating
(A/B, then B/A on the next point). The stand-ins' own latency is the same four calls made
directly, one request at a time, measured before each mode's points; "added" latency is a
system's percentile minus that percentile (the median over rounds). Prints requests/s,
added p50/p99 and the orchestrator's CPU time per request for each system, with the ratios
ours/OPEA; writes JSON to `results/opea-overhead/opea_overhead.json` with the stand-in kind
and the machine's load average, which matters: the cores are shared, so figures from a busy
machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import uvloop
from load_chats import (  # the sibling script: process control and statistics
    REPO,
    STANDINS,
    Process,
    cpu_seconds,
    free_port,
    load_average,
    load_conversations,
    orchestrator_env,
    percentile,
    start_process,
    start_receiver,
    start_remote_chatqna,
    start_upstreams,
)
from provenance import start_run, write_result

OPEA_PYTHON = REPO / ".cache" / "opea-venv" / "bin" / "python"
HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "results" / "opea-overhead" / "opea_overhead.json"
SYSTEMS = ("chatqna", "opea")
TRACED = "chatqna_traced"  # --traced: ChatQnA with 10% of traces exported over OTLP
TRACED_ENV = {
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.1",
}
MODES = ("stream", "non-stream")
# --standins: the cheap HTTP/1.1 stand-ins by default, the FastAPI app (with faults) on request
STANDIN_MODULES = {"fast": "tests.standins.fast_servers", "app": STANDINS}
# The load generator's client, recorded with each run.
LOAD_CLIENT = f"aiohttp {aiohttp.__version__} on uvloop {uvloop.__version__}"
T = TypeVar("T")


# --- services ----------------------------------------------------------------------------


@contextmanager
def services(args: argparse.Namespace, root: Path) -> Iterator[dict[str, Process]]:
    started: dict[str, Process] = {}
    try:
        options = {"delay": args.delay, "tokens": args.tokens}
        module = STANDIN_MODULES[args.standins]
        started["upstreams"] = start_upstreams(root, options, module, args.client_cpu)
        upstream = started["upstreams"].url
        started["chatqna"] = start_remote_chatqna(
            "chatqna", upstream, root, {"OTEL_TRACES_EXPORTER": "none"}, args.orchestrator_cpu
        )
        if args.traced:
            started["receiver"] = start_receiver(root, args.client_cpu)
            exporting = {**TRACED_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": started["receiver"].url}
            started[TRACED] = start_remote_chatqna(
                TRACED, upstream, root, exporting, args.orchestrator_cpu
            )
        port = free_port()
        started["opea"] = start_process(
            "opea",
            [
                str(OPEA_PYTHON),
                str(HERE / "opea" / "megaservice.py"),
                "--port",
                str(port),
                "--upstream",
                upstream,
                "--retriever",
                upstream,
            ],
            orchestrator_env(),
            port,
            root,
            ready_path="/v1/health_check",
            cpus=args.orchestrator_cpu,
        )
        yield started
    finally:
        for process in reversed(started.values()):
            process.stop()


# --- requests ----------------------------------------------------------------------------


def request_body(question: str, stream: bool) -> dict[str, Any]:
    """The same request for both systems: one user turn, OPEA's ChatCompletionRequest."""
    return {
        "messages": [{"role": "user", "content": question}],
        "stream": stream,
        "max_tokens": 32,
        "k": 4,
        "top_n": 3,
    }


def encode(body: dict[str, Any]) -> bytes:
    """A request body as compact UTF-8 JSON (as httpx encodes `json=`), encoded once."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def failure(status: int, body: bytes, stream: bool) -> str | None:
    """Why a response is not a complete answer, or None when it is."""
    if status != 200:
        return f"http_{status}"
    if stream:
        if b"event: error" in body:
            return "sse_error"
        return None if body.endswith(b"data: [DONE]\n\n") else "incomplete_stream"
    content = json.loads(body)["choices"][0]["message"]["content"]
    return None if content else "empty_answer"


def client_session(url: str, concurrency: int) -> aiohttp.ClientSession:
    """A connection per worker, kept alive; idle ones close after 2 s, before the servers'
    5 s keep-alive does (a request sent as the server closes fails with no response)."""
    return aiohttp.ClientSession(
        base_url=url,
        connector=aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=2.0),
        timeout=aiohttp.ClientTimeout(total=60),
        headers={"Content-Type": "application/json"},
    )


# What a failed request raises: aiohttp's errors, a socket's, a timeout, an answer whose
# body is not JSON.
CLIENT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError)
Call = Callable[[aiohttp.ClientSession, str], Awaitable[str | None]]


async def post(session: aiohttp.ClientSession, path: str, body: bytes) -> tuple[int, bytes]:
    """POST JSON bytes and read the whole answer (a stream to its end)."""
    async with session.post(path, data=body) as response:
        return response.status, await response.read()


def system_call(stream: bool) -> Call:
    encoded: dict[str, bytes] = {}  # per question: encoding once keeps the client core free

    async def call(session: aiohttp.ClientSession, question: str) -> str | None:
        body = encoded.get(question)
        if body is None:
            body = encoded[question] = encode(request_body(question, stream))
        status, answer = await post(session, "/v1/chatqna", body)
        return failure(status, answer, stream)

    return call


def direct_call(stream: bool, tokens: int) -> Call:
    """The stand-ins' own work for one request: the four upstream calls, one after another."""

    async def call(session: aiohttp.ClientSession, question: str) -> str | None:
        _, embedded = await post(session, "/v1/embeddings", encode({"input": question}))
        vector = json.loads(embedded)["data"][0]["embedding"]
        _, found = await post(
            session, "/v1/retrieval", encode({"text": question, "embedding": vector, "k": 4})
        )
        texts = [doc["text"] for doc in json.loads(found)["retrieved_docs"]]
        await post(session, "/rerank", encode({"query": question, "texts": texts}))
        chat = {"model": "standin", "messages": [{"role": "user", "content": question}]}
        status, _ = await post(
            session, "/v1/chat/completions", encode(chat | {"stream": stream, "max_tokens": tokens})
        )
        return None if status == 200 else f"http_{status}"

    return call


def drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a closed loop on uvloop, the event loop the service runs on: the load generator
    shares its core with the stand-ins, and uvloop leaves them more of it."""
    return uvloop.run(coroutine)


async def closed_loop(
    url: str,
    call: Call,
    concurrency: int,
    seconds: float,
    questions: Sequence[str],
) -> dict[str, Any]:
    """`concurrency` workers calling back to back for `seconds`; latency per request."""
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    deadline = time.perf_counter() + seconds
    async with client_session(url, concurrency) as session:

        async def worker(offset: int) -> None:
            index = offset
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    error = await call(session, questions[index % len(questions)])
                except CLIENT_ERRORS as exc:
                    error = type(exc).__name__
                index += 1
                if error is None:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors[error] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "errors": dict(errors),
        "elapsed_s": round(elapsed, 2),
        "rps": round(len(latencies) / elapsed, 1),
        "p50_ms": _ms(percentile(latencies, 50)),
        "p99_ms": _ms(percentile(latencies, 99)),
    }


def uptime() -> str:
    """`uptime`'s line: the load average says how busy the shared cores were."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# --- the run -----------------------------------------------------------------------------


def measure_point(
    process: Process, helpers: Sequence[Process], call: Call, args: argparse.Namespace, c: int
) -> dict[str, Any]:
    """One closed-loop point, with the CPU the orchestrator and the client core used."""
    load_before = load_average()
    cpu_before = cpu_seconds(process.pid)
    helper_before = sum(cpu_seconds(h.pid) for h in helpers)
    client_before = time.process_time()
    result = drive(closed_loop(process.url, call, c, args.seconds, args.questions))
    elapsed = result["elapsed_s"]
    result["orchestrator_cpu_share"] = round((cpu_seconds(process.pid) - cpu_before) / elapsed, 2)
    client_cpu = time.process_time() - client_before
    helper_cpu = sum(cpu_seconds(h.pid) for h in helpers) - helper_before
    # Stand-ins plus this load generator share one core: near 1.0 means the client side limits.
    result["client_core_share"] = round((client_cpu + helper_cpu) / elapsed, 2)
    result["load_average_before"] = load_before
    return result


def stand_in_latency(upstreams: Process, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """The four upstream calls made directly, one request at a time, for `--seconds`."""
    call = direct_call(mode == "stream", args.tokens)
    return drive(closed_loop(upstreams.url, call, 1, args.seconds, args.questions))


def systems(args: argparse.Namespace) -> tuple[str, ...]:
    return (SYSTEMS[0], TRACED, SYSTEMS[1]) if args.traced else SYSTEMS


def run_all(procs: dict[str, Process], args: argparse.Namespace) -> dict[str, Any]:
    helpers = [procs["upstreams"], *([procs["receiver"]] if args.traced else [])]
    measured_systems = systems(args)
    for system in measured_systems:  # warm-up: imports, connection pools, first-request paths
        for mode in args.modes:
            call = system_call(mode == "stream")
            drive(closed_loop(procs[system].url, call, 4, args.warmup, args.questions))
    baseline: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    points: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for round_number in range(args.rounds):
        for mode_index, mode in enumerate(args.modes):
            # Measured next to the points it is subtracted from, so the load matches.
            baseline[mode].append(stand_in_latency(procs["upstreams"], mode, args))
            for index, c in enumerate(args.concurrency):
                # The order rotates (A/B, then B/A): no system always runs on the warmer
                # (or noisier) side.
                turn = (round_number + mode_index * len(args.concurrency) + index) % len(
                    measured_systems
                )
                key = f"{mode} c={c}"
                point = points.setdefault(key, {system: [] for system in measured_systems})
                for system in measured_systems[turn:] + measured_systems[:turn]:
                    call = system_call(mode == "stream")
                    measured = measure_point(procs[system], helpers, call, args, c)
                    point[system].append(measured)
                    print(f"  {key} {system}: {measured['rps']} req/s", file=sys.stderr)
    medians = {
        mode: {stat: statistics.median(r[stat] for r in rounds) for stat in ("p50_ms", "p99_ms")}
        for mode, rounds in baseline.items()
    }
    return {"baseline": medians, "baseline_rounds": baseline, "points": points}


def summarise(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per point: the median over rounds per system, added latency, and ours/OPEA ratios."""
    rows = []
    for key, by_system in raw["points"].items():
        mode, c = key.split(" c=")
        base = raw["baseline"][mode]
        row: dict[str, Any] = {"mode": mode, "concurrency": int(c)}
        for system, rounds in by_system.items():
            rps = statistics.median(r["rps"] for r in rounds)
            p50 = statistics.median(r["p50_ms"] for r in rounds)
            p99 = statistics.median(r["p99_ms"] for r in rounds)
            row[system] = {
                "rps": round(rps, 1),
                "p50_ms": round(p50, 1),
                "p99_ms": round(p99, 1),
                "added_p50_ms": round(p50 - base["p50_ms"], 1),
                "added_p99_ms": round(p99 - base["p99_ms"], 1),
                "errors": sum(sum(r["errors"].values()) for r in rounds),
                "orchestrator_cpu_share": statistics.median(
                    r["orchestrator_cpu_share"] for r in rounds
                ),
                "client_core_share": statistics.median(r["client_core_share"] for r in rounds),
                # CPU per request is steadier than req/s when other work shares the core.
                "cpu_ms_per_request": round(
                    statistics.median(
                        r["orchestrator_cpu_share"] * 1000 / r["rps"] for r in rounds if r["rps"]
                    ),
                    2,
                ),
            }
        ours, theirs = row["chatqna"], row["opea"]
        row["ratio"] = {
            "rps": round(ours["rps"] / theirs["rps"], 2),
            "added_p50": _ratio(ours["added_p50_ms"], theirs["added_p50_ms"]),
            "added_p99": _ratio(ours["added_p99_ms"], theirs["added_p99_ms"]),
            "cpu_per_request": _ratio(ours["cpu_ms_per_request"], theirs["cpu_ms_per_request"]),
        }
        if TRACED in row:  # traced CPU against OPEA's untraced
            row["ratio"]["cpu_per_request_traced"] = _ratio(
                row[TRACED]["cpu_ms_per_request"], theirs["cpu_ms_per_request"]
            )
        rows.append(row)
    return rows


def _ratio(ours: float, theirs: float) -> float | None:
    return round(ours / theirs, 2) if theirs > 0 else None


def print_table(rows: list[dict[str, Any]], raw: dict[str, Any], args: argparse.Namespace) -> None:
    base = raw["baseline"]
    print(
        f"ChatQnA vs OPEA ServiceOrchestrator, same {args.standins} stand-ins "
        f"(delay {args.delay} s, {args.tokens} tokens), orchestrators on CPU "
        f"{args.orchestrator_cpu}, client on {args.client_cpu}, {args.seconds:.0f} s per point, "
        f"{args.rounds} round(s)"
    )
    for mode in args.modes:
        print(
            f"stand-ins' own latency ({mode}, four calls in a row): "
            f"p50 {base[mode]['p50_ms']:.1f} ms, p99 {base[mode]['p99_ms']:.1f} ms"
        )
    print(
        "| mode | conc. | req/s ours | req/s OPEA | ratio | added p50 ms ours / OPEA | ratio "
        "| added p99 ms ours / OPEA | ratio | CPU ms/request ours / OPEA | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ours, theirs, ratio = row["chatqna"], row["opea"], row["ratio"]
        print(
            f"| {row['mode']} | {row['concurrency']} | {ours['rps']:.0f} | {theirs['rps']:.0f} "
            f"| {ratio['rps']:.2f} | {ours['added_p50_ms']:.1f} / {theirs['added_p50_ms']:.1f} "
            f"| {_fmt(ratio['added_p50'])} "
            f"| {ours['added_p99_ms']:.1f} / {theirs['added_p99_ms']:.1f} "
            f"| {_fmt(ratio['added_p99'])} "
            f"| {ours['cpu_ms_per_request']:.1f} / {theirs['cpu_ms_per_request']:.1f} "
            f"| {ours['errors']} / {theirs['errors']} |"
        )
    if any(TRACED in row for row in rows):
        print("\nWith tracing on (10% of traces sampled, exported over OTLP/HTTP on loopback):")
        print("| mode | conc. | CPU ms/request traced / untraced / OPEA | traced / OPEA | errors |")
        print("|---|---|---|---|---|")
        for row in rows:
            traced, ours, theirs = row[TRACED], row["chatqna"], row["opea"]
            print(
                f"| {row['mode']} | {row['concurrency']} | {traced['cpu_ms_per_request']:.2f} / "
                f"{ours['cpu_ms_per_request']:.2f} / {theirs['cpu_ms_per_request']:.2f} "
                f"| {_fmt(row['ratio']['cpu_per_request_traced'])} | {traced['errors']} |"
            )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="per point and system")
    parser.add_argument("--warmup", type=float, default=2, help="seconds per system and mode")
    parser.add_argument("--rounds", type=int, default=1, help="A/B rounds (order alternates)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--delay", type=float, default=0.0, help="stand-in delay per call (s)")
    parser.add_argument("--tokens", type=int, default=20, help="tokens per streamed answer")
    parser.add_argument(
        "--standins",
        choices=sorted(STANDIN_MODULES),
        default="fast",
        help="fast: tests/standins/fast_servers.py (HTTP/1.1 on httptools, cheap); "
        "app: the FastAPI stand-ins of tests/standins/servers.py",
    )
    parser.add_argument(
        "--traced",
        action="store_true",
        help="also run ChatQnA with 10%% of traces sampled and exported over OTLP/HTTP to a "
        "receiver on loopback (on the client core), as a third system in the rotation",
    )
    parser.add_argument("--orchestrator-cpu", default="0", help="taskset list for every system")
    parser.add_argument("--client-cpu", default="1", help="taskset list for stand-ins + client")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_run()
    if not OPEA_PYTHON.exists():
        raise SystemExit("no OPEA environment: run benchmarks/opea/setup-venv first")
    args.questions = [question for question, _ in load_conversations()]
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpu.split(",")})
    load_start, uptime_start = load_average(), uptime()
    with tempfile.TemporaryDirectory() as tmp, services(args, Path(tmp)) as procs:
        raw = run_all(procs, args)
    rows = summarise(raw)
    print_table(rows, raw, args)
    report = {
        "benchmark": "opea_overhead",
        "command": "benchmarks/opea_overhead.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "opea_comps": "1.5",
        "settings": {
            "seconds": args.seconds,
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "standins": args.standins,
            "standins_module": STANDIN_MODULES[args.standins],
            "load_client": LOAD_CLIENT,
            "stand_in_delay_s": args.delay,
            "tokens": args.tokens,
            "orchestrator_cpu": args.orchestrator_cpu,
            "client_cpu": args.client_cpu,
            "traced": TRACED_ENV if args.traced else None,
            "request": request_body("<question>", True) | {"stream": "true | false"},
        },
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "uptime": {"start": uptime_start, "end": uptime()},
        "summary": rows,
        "stand_in_latency": raw["baseline"],
        "stand_in_latency_rounds": raw["baseline_rounds"],
        "points": raw["points"],
    }
    write_result(args.output, report)
    print(f"wrote {args.output}")
    errors = sum(row[s]["errors"] for row in rows for s in systems(args))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
