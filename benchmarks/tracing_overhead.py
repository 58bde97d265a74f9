"""What tracing costs: ChatQnA's CPU per turn with tracing off, 10% sampled and every span
exported, beside OPEA's whole CPU per turn.

    .venv/bin/python benchmarks/tracing_overhead.py [--seconds 8] [--rounds 2]

(OPEA's environment is not needed: its figures are read from
`results/opea-overhead/opea_overhead.json`.)

The same stand-ins and requests as `opea_overhead.py` (one process with TEI embeddings and
rerank, an OpenAI chat server streaming `--tokens` tokens and an OPEA `/v1/retrieval`
retriever; single-turn OPEA ChatCompletionRequests, streamed and not), in front of three
`chatqna serve` processes that differ only in tracing: off (no endpoint), 10% of traces
sampled (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`)
and every span, both exporting over OTLP/HTTP to a receiver process on loopback. The
servers are pinned to `--orchestrator-cpu`, the stand-ins, the receiver and this load
generator (`opea_overhead.py`'s: an `aiohttp.ClientSession` on uvloop) to `--client-cpu`.
Each point (mode x concurrency) is a closed loop of
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
    load_average,
    load_conversations,
    start_receiver,
    start_remote_chatqna,
    start_upstreams,
)
from opea_overhead import (
    MODES,
    STANDIN_MODULES,
    closed_loop,
    drive,
    measure_point,
    request_body,
    system_call,
)
from provenance import start_run, write_result

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


@contextmanager
def services(args: argparse.Namespace, root: Path) -> Iterator[dict[str, Process]]:
    started: dict[str, Process] = {}
    try:
        options = {"delay": 0.0, "tokens": args.tokens}
        started["upstreams"] = start_upstreams(
            root, options, STANDIN_MODULES["fast"], args.client_cpu
        )
        started["receiver"] = start_receiver(root, args.client_cpu)
        receiver = started["receiver"].url
        for name, tracing in SETTINGS.items():
            exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver} if tracing else {}
            started[name] = start_remote_chatqna(
                name,
                started["upstreams"].url,
                root,
                {**exporting, **tracing},
                args.orchestrator_cpu,
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
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_run()
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
    write_result(args.output, report, argv=None if argv is None else [sys.argv[0], *argv])
    print(f"wrote {args.output}")
    errors = sum(row[name]["errors"] for row in rows for name in SETTINGS)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
