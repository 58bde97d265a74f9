"""What one upstream call costs the caller's CPU: httpx, httpx2, httpx over aiohttp, aiohttp.

    .venv/bin/pip install -c constraints.txt -e '.[bench]'   # httpx2, httpx-aiohttp: candidates
    .venv/bin/python benchmarks/http_client_cost.py [--calls 2000] [--rounds 3]
        [--concurrency 8 [64 ...]]

Starts the stand-in upstreams (`python -m tests.standins.servers`, their own process) and,
in this process, makes `--calls` embedding calls (`POST /v1/embeddings`, a JSON body in, a
64-float vector out, as the service makes them) and a quarter as many streamed chat calls
(20 SSE chunks read line by line) with each client, at each `--concurrency` (calls in
flight), over a keep-alive pool. The candidates: httpx on its own transport (httpcore's
pool), httpx2 on its own (httpcore2's pool; the maintained continuation of httpx), httpx
over the `httpx-aiohttp` package's transport, aiohttp directly, and the service's
`UpstreamClient` (`chatqna.upstream.client`, on httpx2's own transport, reading bodies in
chunks up to its limit, with the SSE decoder the LLM client uses). All run on the stdlib
event loop and take turns within each round. What is measured is this process's CPU time
per call (`time.process_time`), which the stand-ins' own work does not touch, and calls
per second. Writes `results/http_client_cost.json` with the commit and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import httpx2
from httpx_aiohttp import AiohttpTransport
from load_chats import free_port, load_average, standin_argv, start_process
from opea_overhead import orchestrator_env
from provenance import start_run, write_result

from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.sse import SSEDecoder

HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "results" / "http_client_cost.json"
EMBED = {"input": ["How do I export my workspace data after I cancel?"]}
CHAT = {
    "model": "standin",
    "messages": [{"role": "user", "content": "How do I export my data?"}],
    "stream": True,
}

Call = Callable[[], Awaitable[None]]


def httpx_calls(client: httpx.AsyncClient | httpx2.AsyncClient) -> tuple[Call, Call]:
    async def embed() -> None:
        response = await client.post("/v1/embeddings", json=EMBED)
        response.raise_for_status()
        assert len(response.json()["data"][0]["embedding"]) == 64

    async def chat() -> None:
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
            response.raise_for_status()
            lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]"

    return embed, chat


def aiohttp_calls(session: aiohttp.ClientSession, base: str) -> tuple[Call, Call]:
    async def embed() -> None:
        async with session.post(f"{base}/v1/embeddings", json=EMBED) as response:
            response.raise_for_status()
            body = await response.json()
        assert len(body["data"][0]["embedding"]) == 64

    async def chat() -> None:
        async with session.post(f"{base}/v1/chat/completions", json=CHAT) as response:
            response.raise_for_status()
            lines = [line async for line in response.content if line.startswith(b"data:")]
        assert lines[-1].strip() == b"data: [DONE]"

    return embed, chat


def upstream_calls(client: UpstreamClient) -> tuple[Call, Call]:
    async def embed() -> None:
        reply = await client.post("/v1/embeddings", EMBED)
        assert reply.status == 200
        assert len(reply.json()["data"][0]["embedding"]) == 64

    async def chat() -> None:
        stream = await client.open_stream("/v1/chat/completions", CHAT)
        try:
            assert stream.status == 200
            decoder = SSEDecoder()
            events = [event async for chunk in stream.chunks() for event in decoder.feed(chunk)]
        finally:
            await stream.aclose()
        assert events[-1].is_done

    return embed, chat


async def run(call: Call, calls: int, concurrency: int) -> dict[str, float]:
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_us_per_call": round(cpu / calls * 1e6, 1), "calls_per_s": round(calls / wall, 1)}


async def measure(base: str, args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100, keepalive_expiry=3)
    timeout = httpx.Timeout(30, connect=5)
    plain = httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout)
    successor = httpx2.AsyncClient(
        base_url=base,
        limits=httpx2.Limits(
            max_connections=100, max_keepalive_connections=100, keepalive_expiry=3
        ),
        timeout=httpx2.Timeout(30, connect=5),
    )
    ours = UpstreamClient(base, timeout_seconds=30, connect_timeout_seconds=5)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=3),
        timeout=aiohttp.ClientTimeout(total=30, connect=5),
    )
    packaged = httpx.AsyncClient(
        base_url=base, timeout=timeout, transport=AiohttpTransport(limits=limits)
    )
    clients = {
        "httpx (default transport)": httpx_calls(plain),
        "httpx2 (default transport)": httpx_calls(successor),
        "httpx over aiohttp (httpx-aiohttp package)": httpx_calls(packaged),
        "aiohttp directly": aiohttp_calls(session, base),
        "the service's UpstreamClient (httpx2)": upstream_calls(ours),
    }
    others: list[httpx.AsyncClient | httpx2.AsyncClient | UpstreamClient] = [
        plain,
        successor,
        ours,
        packaged,
    ]
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        name: {"embed": [], "chat": []} for name in clients
    }
    try:
        for embed, chat in clients.values():  # warm-up: pools, first-call paths
            await run(embed, 50, concurrency)
            await run(chat, 50, concurrency)
        for round_number in range(args.rounds):
            order = list(clients.items())
            if round_number % 2:
                order.reverse()
            for name, (embed, chat) in order:
                results[name]["embed"].append(await run(embed, args.calls, concurrency))
                results[name]["chat"].append(await run(chat, args.calls // 4, concurrency))
    finally:
        for client in others:
            await client.aclose()
        await session.close()
    return {
        name: {
            kind: {
                "cpu_us_per_call": statistics.median(r["cpu_us_per_call"] for r in rounds),
                "calls_per_s": statistics.median(r["calls_per_s"] for r in rounds),
                "rounds": rounds,
            }
            for kind, rounds in by_kind.items()
        }
        for name, by_kind in results.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    start_run()
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        upstreams = start_process(
            "upstreams",
            standin_argv(port, {"tokens": 20}),
            orchestrator_env(),
            port,
            Path(tmp),
            ready_path="/health",
        )
        try:
            summaries = {
                str(concurrency): asyncio.run(measure(upstreams.url, args, concurrency))
                for concurrency in args.concurrency
            }
        finally:
            upstreams.stop()
    for concurrency, summary in summaries.items():
        print(f"CPU per call in the caller, {concurrency} in flight, medians of {args.rounds}:")
        print("| client | embeddings call, µs CPU | calls/s | streamed chat (20 chunks), µs CPU |")
        print("|---|---|---|---|")
        for name, kinds in summary.items():
            embed, chat = kinds["embed"], kinds["chat"]
            print(
                f"| {name} | {embed['cpu_us_per_call']:.0f} | {embed['calls_per_s']:.0f} "
                f"| {chat['cpu_us_per_call']:.0f} |"
            )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    report = {
        "benchmark": "http_client_cost",
        "commit": commit,
        "command": "benchmarks/http_client_cost.py " + " ".join(argv or sys.argv[1:]),
        "calls": args.calls,
        "concurrency": args.concurrency,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "summary": summaries,
    }
    write_result(args.output, report)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
