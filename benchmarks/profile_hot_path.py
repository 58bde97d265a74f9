"""Where a request's CPU goes: a py-spy profile of `chatqna serve` behind instant stand-ins.

    .venv/bin/pip install py-spy                 # a profiler, not a service dependency
    .venv/bin/python benchmarks/profile_hot_path.py [--seconds 8] [--concurrency 1 16]
    .venv/bin/python benchmarks/profile_hot_path.py --concurrency 16 --tracing on \
        --configuration traced_every_span

Starts the cheap stand-in upstreams (`python -m tests.standins.fast_servers`, instant
answers, 20 streamed tokens) and `chatqna serve` with `RETRIEVER_ENDPOINT` at the stand-in
retriever (the same set-up as `opea_overhead.py`: tracing and access log off, the server on
`--server-cpu`, the stand-ins and the load on `--client-cpu`). For each mode (stream,
non-stream) and concurrency it runs the closed loop of `opea_overhead.py` while
`py-spy record` samples the server, then sorts every sample by the innermost frame's
package into the groups of `GROUPS`: walking out from the innermost frame, the first frame
in a listed package decides (so `json` called from the SSE framing counts as JSON, and the
rest of the standard library and anyio count where their caller is). py-spy records busy
samples only. Prints the share of busy samples per group and writes them, with the
hottest innermost frames, to `results/profile_hot_path.json` as the named run
`--configuration` (`untraced` by default); the raw collapsed stacks (large) are kept only
with `--raw-dir`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from load_chats import load_average, load_conversations, start_remote_chatqna, start_upstreams
from opea_overhead import STANDIN_MODULES, closed_loop, drive, system_call
from provenance import start_run, write_result

from tests.integration.otlp_receiver import otlp_receiver

HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "results" / "profile_hot_path.json"
# (group, path fragments); the innermost frame's file decides. Order matters.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    (
        "upstream HTTP client (httpx2, httpcore2, h11)",
        (
            "(chatqna/upstream/",
            "(httpx2/",
            "(httpcore2/",
            "(httpx/",
            "(httpx_aiohttp/",
            "(httpcore/",
            "(h11/",
            "(aiohttp/",
            "(yarl/",
            "(multidict/",
        ),
    ),
    ("JSON encoding and decoding", ("(json/", "(orjson")),
    ("validation (pydantic)", ("(pydantic/", "(pydantic_core/")),
    # py-spy shortens the OpenTelemetry packages' paths to the part below `opentelemetry/`.
    (
        "telemetry (opentelemetry, the service's spans, prometheus_client)",
        (
            "(chatqna/telemetry/",
            "(opentelemetry/",
            "(trace/",
            "(context/",
            "(common/_internal/",
            "(_shared_internal/",
            "(http/trace_exporter/",
            "(protobuf/",
            "(prometheus_client/",
        ),
    ),
    ("ChatQnA pipeline and API", ("(chatqna/",)),
    ("numpy", ("(numpy/",)),
    ("framework (starlette, fastapi)", ("(starlette/", "(fastapi/")),
    ("server HTTP (uvicorn, httptools)", ("(uvicorn/", "(httptools/")),
    ("event loop (asyncio, uvloop, sockets)", ("(asyncio/", "(uvloop/", "(selectors", "(socket")),
]
IDLE = ("select (selectors", "run_forever (uvloop")
# Frames that count for their caller: anyio serves both the HTTP client and the framework.
TRANSPARENT = ("(anyio/",)


def classify(stack: str) -> str:
    frames = stack.split(";")
    if any(marker in frames[-1] for marker in IDLE):
        return "idle"
    for frame in reversed(frames):  # the innermost frame in a known package decides
        if any(fragment in frame for fragment in TRANSPARENT):
            continue
        for group, fragments in GROUPS:
            if any(fragment in frame for fragment in fragments):
                return group
    return "other"


def profile_point(
    server_pid: int,
    url: str,
    stream: bool,
    concurrency: int,
    seconds: float,
    out: Path,
    gil_only: bool = False,
    native: bool = False,
) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    record = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(server_pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            str(out),
            # C frames need the process paused while its stack is read.
            *(["--native"] if native else ["--nonblocking"]),
            *(["--gil"] if gil_only else []),
        ],
        stdout=subprocess.DEVNULL,
    )
    questions = [question for question, _ in load_conversations()]
    load = drive(closed_loop(url, system_call(stream), concurrency, seconds, questions))
    record.wait(timeout=60)
    counts: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            counts[classify(stack)] += int(count)
            frames[stack.rsplit(";", 1)[-1]] += int(count)
    busy = sum(n for group, n in counts.items() if group != "idle")
    shares = {
        group: round(n / busy, 3) for group, n in counts.most_common() if group != "idle" and busy
    }
    hottest = {frame: round(n / busy, 3) for frame, n in frames.most_common(15) if busy}
    return {
        "load": load,
        "samples_busy": busy,
        "samples_idle": counts["idle"],
        "shares": shares,
        "hottest_innermost_frames": hottest,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--configuration",
        default="untraced",
        help="the named run of --output this one replaces",
    )
    parser.add_argument("--server-cpu", default="0", help="taskset list for the server")
    parser.add_argument(
        "--client-cpu", default="1", help="taskset list for the stand-ins (and this script)"
    )
    parser.add_argument("--raw-dir", type=Path, default=None, help="keep py-spy's raw stacks")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="count only samples holding the GIL (a thread waiting on a socket is not busy)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="include C frames (uvloop, the kernel's socket calls); pauses the server per sample",
    )
    parser.add_argument(
        "--tracing",
        choices=("off", "on", "sampled"),
        default="off",
        help="export every span (on) or 10%% of traces (sampled) to a local OTLP receiver",
    )
    args = parser.parse_args(argv)
    start_run()
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpu.split(",")})
    results: dict[str, Any] = {}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.raw_dir is not None:
        args.raw_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, otlp_receiver() as (receiver, _):
        root = Path(tmp)
        tracing = {"OTEL_TRACES_EXPORTER": "none"}
        if args.tracing != "off":
            tracing = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver}
        if args.tracing == "sampled":
            tracing["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
            tracing["OTEL_TRACES_SAMPLER_ARG"] = "0.1"
        upstreams = start_upstreams(root, {"tokens": 20}, STANDIN_MODULES["fast"], args.client_cpu)
        server = start_remote_chatqna("chatqna", upstreams.url, root, tracing, args.server_cpu)
        try:
            questions = [question for question, _ in load_conversations()]
            for stream in (True, False):  # warm-up
                drive(closed_loop(server.url, system_call(stream), 4, 2, questions))
            for stream in (True, False):
                for c in args.concurrency:
                    key = f"{'stream' if stream else 'non-stream'} c={c}"
                    raw = (args.raw_dir or root) / (
                        f"profile_hot_path_{key.replace(' ', '_').replace('=', '')}.txt"
                    )
                    results[key] = profile_point(
                        server.pid, server.url, stream, c, args.seconds, raw, args.gil, args.native
                    )
                    print(f"{key}: {results[key]['load']['rps']} req/s", file=sys.stderr)
        finally:
            server.stop()
            upstreams.stop()
    for key, point in results.items():
        print(f"\n{key} ({point['load']['rps']} req/s, {point['samples_busy']} busy samples)")
        for group, share in point["shares"].items():
            print(f"  {share * 100:5.1f}%  {group}")
    report = {
        "benchmark": "profile_hot_path",
        "load_average": load_average(),
        "tracing": args.tracing,
        "gil_only": args.gil,
        "native": args.native,
        "points": results,
    }
    command = None if argv is None else [sys.argv[0], *argv]
    write_result(args.output, report, configuration=args.configuration, argv=command)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
