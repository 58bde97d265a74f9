"""What tracing costs in instructions: the server's CPU instructions per request, counted by
valgrind, with tracing off, every span exported, and 10% of traces sampled.

    apt-get install valgrind                      # not a service or test dependency
    .venv/bin/python tests/rag-benchmarks/tracing_instructions.py [--requests 200]
        [--settings off on sampled]

`tracing_overhead.py` measures requests per second, which is what a user sees, but on a
shared machine two identical server processes differ by up to 8% in speed, the same size as
the cost being measured. An instruction count does not drift: the same build, the same
requests and the same hash seed give the same count (two untraced runs differed by 0.2%).
It is a proxy, not a time: it sees neither cache misses nor waits.

For each setting the script starts `chatqna serve` under callgrind (about 50 times slower),
with the sample corpus's index (ingested once, copied for each server) and the cheap
stand-in upstreams (`tests.standins.fast_servers`, not under valgrind) and, for the traced
settings, a loopback OTLP receiver. It warms the server with `--warm` requests, zeroes the
counters, sends `--requests` streaming two-turn chats (`--concurrency` at a time), waits for
the last export, and reads the counts of every thread: the request path (the main thread),
the span exporter and the retriever's worker threads. `OTEL_BSP_SCHEDULE_DELAY` is set to a
minute, so that spans leave in full batches of 512 as they do under load; at valgrind's
pace a 1 s delay would send a batch of a few dozen spans every second. Writes
`results/tracing_instructions.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from opea_overhead import STANDIN_MODULES  # noqa: E402
from tracing_overhead import CHAT, wait_ready  # noqa: E402

from tests.integration.otlp_receiver import otlp_receiver  # noqa: E402
from tests.standins.servers import free_port  # noqa: E402

SETTINGS = ("off", "on", "sampled")
SAMPLE_CORPUS = REPO / "chatqna" / "sample_corpus"
# Long enough for the spans of the last requests to leave.
SETTLE_SECONDS = 2.5


async def chats(url: str, count: int, concurrency: int) -> None:
    """`count` streaming chats; any answer but a complete stream fails the run."""
    body = {"messages": CHAT, "max_tokens": 20}
    left = count
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                response = await client.post("/v1/chatqna", json=body)
                if response.status_code != 200 or not response.text.endswith("[DONE]\n\n"):
                    raise RuntimeError(f"bad answer {response.status_code}: {response.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def callgrind_control(action: str, pid: int) -> None:
    subprocess.run(["callgrind_control", action, str(pid)], check=True, capture_output=True)


def thread_counts(out_prefix: Path) -> list[int]:
    """The instructions of each thread in the dump triggered as `measured`, largest first."""
    counts = []
    for path in out_prefix.parent.glob(out_prefix.name + ".*"):
        trigger = ""
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("desc: Trigger"):
                trigger = line
            elif line.startswith(("summary:", "totals:")) and "measured" in trigger:
                counts.append(int(line.split()[1]))
                break
    return sorted(counts, reverse=True)


def measure(
    setting: str, env: dict[str, str], root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    port = free_port()
    out_prefix = root / f"callgrind-{setting}"
    log = root / f"{setting}.log"
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            "--dump-line=no",
            f"--callgrind-out-file={out_prefix}.%p",
            sys.executable,
            "-m",
            "chatqna",
            "serve",
        ],
        cwd=REPO,
        env={**env, "MEGA_SERVICE_PORT": str(port)},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        wait_ready(url, timeout=900)
        print(
            f"{setting}: ready under valgrind in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
        asyncio.run(chats(url, args.warm, args.concurrency))
        time.sleep(SETTLE_SECONDS)
        subprocess.run(
            ["callgrind_control", "--zero", str(server.pid)], check=True, capture_output=True
        )
        started = time.monotonic()
        asyncio.run(chats(url, args.requests, args.concurrency))
        time.sleep(SETTLE_SECONDS)
        subprocess.run(
            ["callgrind_control", "--dump=measured", str(server.pid)],
            check=True,
            capture_output=True,
        )
        print(
            f"{setting}: {args.requests} requests in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    counts = thread_counts(out_prefix)
    if not counts:
        raise RuntimeError(f"no callgrind dump for {setting}; see {log}")
    main_thread = counts[0]  # the event loop's thread does by far the most
    return {
        "instructions_per_request": sum(counts) / args.requests,
        "main_thread_per_request": main_thread / args.requests,
        "other_threads_per_request": (sum(counts) - main_thread) / args.requests,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warm", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).parent / "results" / "tracing_instructions.json",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, otlp_receiver() as (receiver, received):
        root = Path(tmp)
        base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TEI_", "LLM_"))
        }
        standin_port = free_port()
        standin = subprocess.Popen(
            [sys.executable, "-m", STANDIN_MODULES["fast"], "--port", str(standin_port)],
            cwd=REPO,
            env=base_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            standin_url = f"http://127.0.0.1:{standin_port}"
            wait_ready(standin_url, "/health")
            template = root / "template"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "chatqna",
                    "ingest",
                    str(REPO / "chatqna" / "sample_corpus"),
                ],
                cwd=REPO,
                env={
                    **base_env,
                    "CHATQNA_DATA_DIR": str(template),
                    "CHATQNA_LOG_LEVEL": "WARNING",
                    "TEI_EMBEDDING_ENDPOINT": standin_url,
                },
                check=True,
                capture_output=True,
                timeout=300,
            )
            for setting in args.settings:
                data_dir = root / f"data-{setting}"
                shutil.copytree(template, data_dir)
                env = {
                    **base_env,
                    "PYTHONHASHSEED": "0",
                    "CHATQNA_DATA_DIR": str(data_dir),
                    "CHATQNA_LOG_LEVEL": "WARNING",
                    "TEI_EMBEDDING_ENDPOINT": standin_url,
                    "TEI_RERANKING_ENDPOINT": standin_url,
                    "LLM_ENDPOINT": standin_url,
                    "LLM_MODEL_ID": "standin",
                    "OTEL_TRACES_EXPORTER": "none" if setting == "off" else "otlp",
                    "OTEL_EXPORTER_OTLP_ENDPOINT": receiver,
                    "OTEL_BSP_SCHEDULE_DELAY": "60000",
                }
                if setting == "sampled":
                    env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
                    env["OTEL_TRACES_SAMPLER_ARG"] = "0.1"
                results[setting] = measure(setting, env, root, args)
        finally:
            standin.terminate()
            standin.wait(30)
        spans = received.span_count()
    base = results.get("off", {}).get("instructions_per_request")
    print(
        f"\n{args.requests} streaming two-turn chats a setting, instructions counted by callgrind:"
    )
    print("| tracing | instructions/request | main thread | other threads | vs off |")
    print("|---|---|---|---|---|")
    for setting, figures in results.items():
        versus = f"{figures['instructions_per_request'] / base - 1:+.1%}" if base else "-"
        figures["versus_off"] = figures["instructions_per_request"] / base - 1 if base else None
        print(
            f"| {setting} | {figures['instructions_per_request'] / 1e6:.3f} M "
            f"| {figures['main_thread_per_request'] / 1e6:.3f} M "
            f"| {figures['other_threads_per_request'] / 1e6:.3f} M | {versus} |"
        )
    print(f"spans received: {spans}")
    report = {
        "benchmark": "tracing_instructions",
        "command": "tests/rag-benchmarks/tracing_instructions.py " + " ".join(sys.argv[1:]),
        "requests": args.requests,
        "warm": args.warm,
        "concurrency": args.concurrency,
        "settings": results,
        "spans_received": spans,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
