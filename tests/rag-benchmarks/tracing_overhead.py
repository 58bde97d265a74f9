"""What tracing costs: ChatQnA's CPU per turn with tracing off, 10% sampled and every span
exported, beside OPEA's whole CPU per turn.

    tests/rag-benchmarks/opea/setup-venv     # not needed: OPEA's figures are read from
                                             # results/opea-overhead/opea_overhead.json
    .venv/bin/python tests/rag-benchmarks/tracing_overhead.py [--seconds 8] [--rounds 2]

The same stand-ins and requests as `opea_overhead.py` (one process with TEI embeddings and
rerank, an OpenAI chat server streaming `--tokens` tokens and an OPEA `/v1/retrieval`
retriever; single-turn OPEA ChatCompletionRequests, streamed and not), in front of three
`chatqna serve` processes that differ only in tracing: off (no endpoint), 10% of traces
sampled (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`)
and every span, both exporting over OTLP/HTTP to a receiver process on loopback. The
servers are pinned to `--orchestrator-cpu`, the stand-ins, the receiver and this load
generator to `--client-cpu`. Each point (mode x concurrency) is a closed loop of
`--seconds` per setting, the settings' order rotating from point to point and round to
round; a setting's CPU ms per request is the median over rounds of its server's CPU time
over the requests answered. OPEA's CPU ms per request at the same point comes from the
last `opea_overhead.py` run. Writes `results/tracing_overhead.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from load_chats import (
    REPO,
    Process,
    free_port,
    load_average,
    load_conversations,
    standin_argv,
    start_process,
)
from opea_overhead import (
    LOAD_CLIENTS,
    MODES,
    STANDIN_MODULES,
    closed_loop,
    drive,
    measure_point,
    orchestrator_env,
    request_body,
    system_call,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "results" / "tracing_overhead.json"
OPEA_RESULTS = HERE / "results" / "opea-overhead" / "opea_overhead.json"
SETTINGS: dict[str, dict[str, str]] = {
    "off": {},
    "sampled_10pct": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
    "every_span": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()


@contextmanager
def services(args: argparse.Namespace, root: Path) -> Iterator[dict[str, Process]]:
    started: dict[str, Process] = {}
    try:
        port = free_port()
        started["upstreams"] = start_process(
            "upstreams",
            standin_argv(port, {"delay": 0.0, "tokens": args.tokens}, STANDIN_MODULES["fast"]),
            orchestrator_env(),
            port,
            root,
            ready_path="/health",
            cpus=args.client_cpu,
        )
        upstream = started["upstreams"].url
        port = free_port()
        started["receiver"] = start_process(
            "receiver",
            [sys.executable, "-m", "tests.integration.otlp_receiver", str(port)],
            orchestrator_env(),
            port,
            root,
            ready_path="/",
            cpus=args.client_cpu,
        )
        receiver = started["receiver"].url
        for name, tracing in SETTINGS.items():
            port = free_port()
            exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver} if tracing else {}
            started[name] = start_process(
                name,
                [sys.executable, "-m", "chatqna", "serve"],
                {
                    **orchestrator_env(),
                    "MEGA_SERVICE_PORT": str(port),
                    "CHATQNA_HOST": "127.0.0.1",
                    "CHATQNA_DATA_DIR": str(root / "data"),
                    "CHATQNA_LOG_LEVEL": "WARNING",
                    "TEI_EMBEDDING_ENDPOINT": upstream,
                    "TEI_RERANKING_ENDPOINT": upstream,
                    "RETRIEVER_ENDPOINT": upstream,
                    "LLM_ENDPOINT": upstream,
                    "LLM_MODEL_ID": "standin",
                    **exporting,
                    **tracing,
                },
                port,
                root,
                ready_path="/v1/ready",
                cpus=args.orchestrator_cpu,
            )
        yield started
    finally:
        for process in reversed(started.values()):
            process.stop()


def run_all(procs: dict[str, Process], args: argparse.Namespace) -> dict[str, Any]:
    helpers = [procs["upstreams"], procs["receiver"]]
    names = list(SETTINGS)
    for name in names:  # warm-up: imports, connection pools, first-request paths
        for mode in args.modes:
            call = system_call(mode == "stream")
            drive(closed_loop(procs[name].url, call, 4, args.warmup, args.questions))
    points: dict[str, dict[str, list[dict[str, Any]]]] = {}
    turn = 0
    for _ in range(args.rounds):
        for mode in args.modes:
            for c in args.concurrency:
                key = f"{mode} c={c}"
                point = points.setdefault(key, {name: [] for name in names})
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                for name in order:
                    call = system_call(mode == "stream")
                    measured = measure_point(procs[name], helpers, call, args, c)
                    point[name].append(measured)
                    print(f"  {key} {name}: {measured['rps']} req/s", file=sys.stderr)
                time.sleep(1.5)  # the traced servers' last batches leave before the next point
    return points


def cpu_ms(rounds: Sequence[dict[str, Any]]) -> float:
    return round(
        statistics.median(
            r["orchestrator_cpu_share"] * 1000 / r["rps"] for r in rounds if r["rps"]
        ),
        2,
    )


def summarise(points: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    opea = {}
    if OPEA_RESULTS.exists():
        for row in json.loads(OPEA_RESULTS.read_text())["summary"]:
            opea[(row["mode"], row["concurrency"])] = row["opea"]["cpu_ms_per_request"]
    rows = []
    for key, by_setting in points.items():
        mode, c = key.split(" c=")
        row: dict[str, Any] = {"mode": mode, "concurrency": int(c)}
        for name, rounds in by_setting.items():
            row[name] = {
                "cpu_ms_per_request": cpu_ms(rounds),
                "rps": round(statistics.median(r["rps"] for r in rounds), 1),
                "errors": sum(sum(r["errors"].values()) for r in rounds),
            }
        off = row["off"]["cpu_ms_per_request"]
        for name in SETTINGS:
            if name != "off":
                row[name]["added_cpu_ms"] = round(row[name]["cpu_ms_per_request"] - off, 2)
        theirs = opea.get((mode, int(c)))
        row["opea_cpu_ms_per_request"] = theirs
        if theirs:
            row["ratio_to_opea"] = {
                name: round(row[name]["cpu_ms_per_request"] / theirs, 2) for name in SETTINGS
            }
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| mode | conc. | CPU ms/turn off | 10% sampled | every span | OPEA (untraced) "
        "| ratio to OPEA: off / 10% / every |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        ratios = row.get("ratio_to_opea", {})
        print(
            f"| {row['mode']} | {row['concurrency']} "
            f"| {row['off']['cpu_ms_per_request']:.2f} "
            f"| {row['sampled_10pct']['cpu_ms_per_request']:.2f} "
            f"| {row['every_span']['cpu_ms_per_request']:.2f} "
            f"| {row['opea_cpu_ms_per_request'] or '-'} "
            f"| {' / '.join(str(ratios.get(name, '-')) for name in SETTINGS)} |"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8, help="per point and setting")
    parser.add_argument("--warmup", type=float, default=2, help="seconds per setting and mode")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--tokens", type=int, default=20, help="tokens per streamed answer")
    parser.add_argument("--orchestrator-cpu", default="0", help="taskset list for the servers")
    parser.add_argument("--client-cpu", default="1", help="stand-ins, receiver and client")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    args.load_client = LOAD_CLIENTS[0]  # measure_point's client: the lean one
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.questions = [question for question, _ in load_conversations()]
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpu.split(",")})
    load_start = load_average()
    with tempfile.TemporaryDirectory() as tmp, services(args, Path(tmp)) as procs:
        points = run_all(procs, args)
        time.sleep(2)
        exported = int(httpx.get(procs["receiver"].url, timeout=5).text)
    rows = summarise(points)
    print_table(rows)
    print(f"spans received: {exported}")
    report = {
        "benchmark": "tracing_overhead",
        "commit": git_commit(),
        "command": "tests/rag-benchmarks/tracing_overhead.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {
            "seconds": args.seconds,
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "tokens": args.tokens,
            "standins_module": STANDIN_MODULES["fast"],
            "orchestrator_cpu": args.orchestrator_cpu,
            "client_cpu": args.client_cpu,
            "tracing": SETTINGS,
            "exporter": "OTLP/HTTP (protobuf) to a receiver process on loopback",
            "request": request_body("<question>", True) | {"stream": "true | false"},
            "opea_figures": str(OPEA_RESULTS.relative_to(REPO)),
        },
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "spans_received": exported,
        "summary": rows,
        "points": points,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    errors = sum(row[name]["errors"] for row in rows for name in SETTINGS)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
