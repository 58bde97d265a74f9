"""What tracing costs: requests per second with tracing off vs on, in one run.

    .venv/bin/python tests/rag-benchmarks/tracing_overhead.py [--seconds 2] [--rounds 24]
        [--replicas 3] [--aa] [--together]
        # the documented run: --together --replicas 16 --rounds 96

Starts the stand-in TEI + OpenAI upstreams (instant answers, 20 streamed tokens; the cheap
`tests.standins.fast_servers` unless `--standins app`) and ChatQnA server processes on
loopback that differ only in tracing: off, every span exported over OTLP/HTTP to a local
receiver started here, and 10% of traces sampled. All get the sample corpus (the embedded
index). Then it alternates rounds of `--concurrency` streaming two-turn chats against each
setting for `--seconds`, and prints requests/s, latency percentiles and the server's CPU
time per request per setting, and the ratios: of the medians, and the median of each
round's ratio to the untraced round next to it, each with a 95% interval from a bootstrap
over replicas (`replica_bootstrap`): how precisely the run pins the cost down.

Two things this machine does to such a comparison, and what the script does about them:
- Two processes of the same code differ, by up to a quarter when each ingested the corpus
  itself (their indexes differ in segments, and so in what a search costs). So the corpus
  is ingested once (`chatqna ingest`) and the index copied for every server, every server
  gets the same hash seed and runs without address-space randomization (`setarch -R`),
  each setting gets `--replicas` processes, and round `n` of every setting runs on replica
  `n % replicas`. Without randomization the environment's size sets where the stack
  starts, so the settings' environments (which differ in their OTEL_ variables) are
  padded to one size per replica, plus an offset drawn per replica (`same_layout`): the
  settings of a replica share one layout, and each replica draws another. The JSON
  keeps each server's start of stack. `--aa` starts every setting untraced, which
  measures what is left of that floor.
- The machine's speed drifts from minute to minute, and from one second to the next: it is
  a VM whose vCPUs the host takes away at times. Short rounds (`--seconds`), many of them,
  alternating (the order reversed every other round) keep the settings side by side, but
  a round's requests/s still moved by about 15% from the untraced round beside it in A/A
  runs. `--together` loads every setting's server of a replica at once instead, all on
  the one server core, so whatever the machine does in those seconds it does to every
  setting; each server starts in a session of its own, and so an autogroup of its own,
  and the scheduler splits the core evenly between the processes (the JSON keeps each
  server's share, and how much of the core was idle or taken by the host). With equal
  shares, the ratio of requests/s is the inverse ratio of CPU per request.
A pause between rounds lets a traced server's last export finish before the next server's
round starts (the server's CPU is counted through the pause), and half a second of
unmeasured load before each round warms a server that sat idle while the others ran (in an
A/A run without it, the setting that never came first in a round measured 3-9% faster).

As in `opea_overhead.py`, the servers are pinned to `--server-cpu` and the stand-ins, the
receiver and this aiohttp load generator to `--client-cpu`, so what is measured is the
server's cost, not the collector's; the client core's share is reported (near 1.0 it is
the limit). Each round also records the 1-minute load average at its end. Writes
`results/tracing_overhead.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import httpx  # noqa: E402
from load_chats import cpu_seconds  # noqa: E402
from opea_overhead import STANDIN_MODULES  # noqa: E402

from tests.integration.otlp_receiver import otlp_receiver  # noqa: E402
from tests.standins.servers import free_port  # noqa: E402

# off: OTEL_TRACES_EXPORTER=none; on: every span exported; sampled: 10% of traces.
SETTINGS = ("off", "on", "sampled")
# Longer than the exporter's schedule delay (1 s): a round's last spans leave in the pause.
PAUSE_SECONDS = 1.5
# Unmeasured load before each round: a server idle while the others ran starts cold.
WARM_SECONDS = 0.5
CHAT = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings > Workspace > Export."},
    {"role": "user", "content": "Is that possible after I cancel?"},
]


def throughput_ratios(
    results: dict[str, list[dict[str, Any]]], rounds: range | list[int]
) -> dict[str, float]:
    """Both measures of the run over the rounds `rounds` (indices, repeats allowed): for each
    traced setting, the ratio of its median requests/s to the untraced one's, and the median
    of each round's ratio to the untraced round beside it."""
    off = [results["off"][n]["rps"] for n in rounds]
    ratios: dict[str, float] = {}
    for setting in ("on", "sampled"):
        traced = [results[setting][n]["rps"] for n in rounds]
        ratios[f"ratio_{setting}_off"] = statistics.median(traced) / statistics.median(off)
        ratios[f"paired_ratio_{setting}_off"] = statistics.median(
            t / o for t, o in zip(traced, off, strict=True)
        )
    return ratios


def replica_bootstrap(
    results: dict[str, list[dict[str, Any]]], replicas: int, draws: int = 2000
) -> dict[str, list[float]]:
    """A 95% interval for each measure of `throughput_ratios`, from resampling replicas.

    Round `n` of every setting ran on replica `n % replicas`, and a server process is the
    largest source of spread here (identical untraced processes differ by up to 8%), so
    the rounds of one replica are not independent: the bootstrap draws whole replicas with
    replacement, with all their rounds, and takes the 2.5th and 97.5th percentiles of each
    measure over `draws` draws (seeded: the same results give the same interval)."""
    by_replica = [
        [n for n in range(len(results["off"])) if n % replicas == r] for r in range(replicas)
    ]
    draw = random.Random(0)
    samples: dict[str, list[float]] = {}
    for _ in range(draws):
        chosen = [n for _ in range(replicas) for n in draw.choice(by_replica)]
        for name, value in throughput_ratios(results, chosen).items():
            samples.setdefault(name, []).append(value)
    interval: dict[str, list[float]] = {}
    for name, values in samples.items():
        values.sort()
        interval[name] = [values[int(0.025 * draws)], values[int(0.975 * draws) - 1]]
    return interval


def replica_envs(
    replica: int,
    aa: bool,
    root: Path,
    template: Path,
    base_env: dict[str, str],
    standin: str,
    receiver: str,
) -> list[dict[str, str]]:
    """The environment of each setting's server of `replica` (in `SETTINGS` order), each
    with a port and a copy of the `template` index of its own."""
    envs: list[dict[str, str]] = []
    for setting in SETTINGS:
        traced = setting != "off" and not aa
        data_dir = root / f"{setting}-{replica}"
        shutil.copytree(template, data_dir)
        env = {
            **base_env,
            "PYTHONHASHSEED": "0",
            "MEGA_SERVICE_PORT": str(free_port()),
            "CHATQNA_DATA_DIR": str(data_dir),
            "CHATQNA_LOG_LEVEL": "WARNING",
            "TEI_EMBEDDING_ENDPOINT": standin,
            "TEI_RERANKING_ENDPOINT": standin,
            "LLM_ENDPOINT": standin,
            "LLM_MODEL_ID": "standin",
            "OTEL_TRACES_EXPORTER": "otlp" if traced else "none",
        }
        if traced:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver
        if traced and setting == "sampled":
            env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
            env["OTEL_TRACES_SAMPLER_ARG"] = "0.1"
        envs.append(env)
    return envs


def same_layout(envs: list[dict[str, str]], offset: int) -> list[dict[str, str]]:
    """`envs`, each padded with `LAYOUT_PAD<n>` variables to the same number of variables
    and the same size in bytes, plus `offset` bytes.

    A process's environment sits at the top of its stack, so without address-space
    randomization its size decides where the stack starts, and so how the interpreter's C
    frames fall on cache lines and pages. Servers whose settings add different variables
    would each keep one layout for the whole run, and a layout can be worth a few percent
    either way: a bias per setting that no number of rounds averages out. Padded, the
    settings of a replica share one layout, and `offset` gives each replica another."""
    most = max(len(env) for env in envs)
    padded = [{**env, **{f"LAYOUT_PAD{n}": "" for n in range(most - len(env) + 1)}} for env in envs]

    def size(env: dict[str, str]) -> int:
        return sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())

    target = max(size(env) for env in padded) + offset
    for original, env in zip(envs, padded, strict=True):
        env[f"LAYOUT_PAD{most - len(original)}"] = "x" * (target - size(env))
    return padded


def start_of_stack(pid: int) -> int:
    """Where the process's stack starts (`startstack` in `/proc/<pid>/stat`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[25])


def wait_ready(url: str, path: str = "/v1/ready", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def start(
    args: list[str], env: dict[str, str], log: Path, cpus: str, *, fixed_layout: bool = False
) -> subprocess.Popen[bytes]:
    """Start a process pinned to `cpus`; with `fixed_layout`, without address-space
    randomization (`setarch -R`), so that every server lays out its memory the same way."""
    prefix = (
        ["setarch", platform.machine(), "-R"] if fixed_layout and shutil.which("setarch") else []
    )
    return subprocess.Popen(
        [*prefix, "taskset", "-c", cpus, sys.executable, *args],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        # A session of its own is an autogroup of its own: servers sharing a core get equal
        # shares of it per process, whatever threads each runs (the exporter's, for one).
        start_new_session=True,
    )


async def round_of_load(url: str, seconds: float, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    body = {"messages": CHAT, "max_tokens": 20}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as client:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async with client.post("/v1/chatqna", json=body) as response:
                    text = await response.read()
                if response.status != 200 or not text.endswith(b"[DONE]\n\n"):
                    errors += 1
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "elapsed_s": elapsed,
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1],
        "load_average": os.getloadavg()[0],
    }


def measured_round(
    url: str, server: subprocess.Popen[bytes], helpers: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """One round, with the server's CPU per request (through the pause after it, where its
    last export lands) and the client core's busy share."""
    asyncio.run(round_of_load(url, WARM_SECONDS, args.concurrency))  # caches back, not counted
    server_before = cpu_seconds(server.pid)
    client_before = time.process_time() + sum(cpu_seconds(pid) for pid in helpers)
    result = asyncio.run(round_of_load(url, args.seconds, args.concurrency))
    client_cpu = time.process_time() + sum(cpu_seconds(pid) for pid in helpers) - client_before
    time.sleep(PAUSE_SECONDS)
    server_cpu = cpu_seconds(server.pid) - server_before
    result["server_cpu_ms_per_request"] = server_cpu * 1000 / max(result["requests"], 1)
    result["client_core_share"] = client_cpu / result["elapsed_s"]
    return result


def core_times(cpus: str) -> tuple[int, int, int]:
    """Clock ticks the cores `cpus` (a taskset list of numbers) spent in all, idle (or
    waiting on I/O) and stolen by the host so far, from `/proc/stat`."""
    wanted = {f"cpu{cpu}" for cpu in cpus.split(",")}
    total = idle = steal = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *ticks = line.split()
        if name in wanted:
            values = [int(t) for t in ticks[:8]]
            total += sum(values)
            idle += values[3] + values[4]
            steal += values[7]
    return total, idle, steal


def together_round(
    urls: list[str],
    servers: list[subprocess.Popen[bytes]],
    helpers: list[int],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """One round of `--together`: every setting's server of a replica under load at once,
    on the one server core, so that whatever the machine does to its speed in those seconds
    it does to every setting alike. Each server's result also holds its share of the core
    in the round (`server_cpu_share`; equal shares mean the scheduler split the core
    evenly, so the ratio of requests/s is the inverse ratio of CPU per request) and the
    servers' summed share (`server_core_share`), and how much of the server core's time
    in the round was idle (`server_core_idle`; near 0 the server core was the limit) or
    taken by the host (`server_core_steal`: a vCPU's time the servers could not run)."""

    async def load(seconds: float) -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(*(round_of_load(u, seconds, args.concurrency) for u in urls))
        )

    asyncio.run(load(WARM_SECONDS))  # caches back, not counted
    before = [cpu_seconds(server.pid) for server in servers]
    client_before = time.process_time() + sum(cpu_seconds(pid) for pid in helpers)
    ticks_before = core_times(args.server_cpu)
    started = time.perf_counter()
    results = asyncio.run(load(args.seconds))
    elapsed = time.perf_counter() - started
    total, idle, steal = (
        after - before
        for after, before in zip(core_times(args.server_cpu), ticks_before, strict=True)
    )
    in_round = [cpu_seconds(server.pid) - b for server, b in zip(servers, before, strict=True)]
    client_cpu = time.process_time() + sum(cpu_seconds(pid) for pid in helpers) - client_before
    time.sleep(PAUSE_SECONDS)
    for result, server, b, cpu in zip(results, servers, before, in_round, strict=True):
        result["server_cpu_ms_per_request"] = (
            (cpu_seconds(server.pid) - b) * 1000 / max(result["requests"], 1)
        )
        result["server_cpu_share"] = cpu / elapsed
        result["server_core_share"] = sum(in_round) / elapsed
        result["server_core_idle"] = idle / max(total, 1)
        result["server_core_steal"] = steal / max(total, 1)
        result["client_core_share"] = client_cpu / elapsed
    return results


def run_rounds(
    results: dict[str, list[dict[str, Any]]],
    urls: dict[str, list[str]],
    servers: dict[str, list[subprocess.Popen[bytes]]],
    helpers: list[int],
    args: argparse.Namespace,
) -> None:
    """Every round of the run into `results`: round `n` on replica `n % replicas`, the
    settings in turn (the order reversed every other round) or, with `--together`, at once
    (the order their clients start in turning with the round)."""
    for number in range(args.rounds):
        replica = number % args.replicas
        if args.together:
            turn = [SETTINGS[(number + k) % len(SETTINGS)] for k in range(len(SETTINGS))]
            together = together_round(
                [urls[setting][replica] for setting in turn],
                [servers[setting][replica] for setting in turn],
                helpers,
                args,
            )
            for setting, result in zip(turn, together, strict=True):
                results[setting].append(result)
        else:
            for setting in SETTINGS if number % 2 == 0 else SETTINGS[::-1]:
                results[setting].append(
                    measured_round(urls[setting][replica], servers[setting][replica], helpers, args)
                )
        if (number + 1) % 6 == 0:
            print(f"round {number + 1}/{args.rounds}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--replicas", type=int, default=3, help="server processes per setting")
    parser.add_argument(
        "--aa", action="store_true", help="every setting untraced: the harness's own floor"
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="load every setting's server of a replica at once (the core shared), not in turn",
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--standins", choices=sorted(STANDIN_MODULES), default="fast")
    parser.add_argument("--server-cpu", default="0", help="taskset list for the servers")
    parser.add_argument("--client-cpu", default="1", help="stand-ins, receiver and load")
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "tracing_overhead.json"
    )
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpu.split(",")})
    processes: list[subprocess.Popen[bytes]] = []
    servers: dict[str, list[subprocess.Popen[bytes]]] = {setting: [] for setting in SETTINGS}
    stacks: dict[str, list[int]] = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp, otlp_receiver() as (receiver, received):
        root = Path(tmp)
        standin_port = free_port()
        base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TEI_", "LLM_"))
        }
        processes.append(
            start(
                ["-m", STANDIN_MODULES[args.standins], "--port", str(standin_port)],
                base_env,
                root / "standin.log",
                args.client_cpu,
            )
        )
        standin = f"http://127.0.0.1:{standin_port}"
        wait_ready(standin, "/health")
        urls: dict[str, list[str]] = {setting: [] for setting in SETTINGS}
        # One index, copied for every server: indexes ingested one by one differ in their
        # segments, and so in what a search costs.
        template = root / "template"
        subprocess.run(
            [sys.executable, "-m", "chatqna", "ingest", str(REPO / "chatqna" / "sample_corpus")],
            cwd=REPO,
            env={
                **base_env,
                "CHATQNA_DATA_DIR": str(template),
                "CHATQNA_LOG_LEVEL": "WARNING",
                "TEI_EMBEDDING_ENDPOINT": standin,  # the servers' embedder
            },
            check=True,
            capture_output=True,
            timeout=300,
        )
        try:
            offsets = random.Random(1)
            for replica in range(args.replicas):
                envs = replica_envs(replica, args.aa, root, template, base_env, standin, receiver)
                for setting, env in zip(SETTINGS, envs, strict=True):
                    urls[setting].append(f"http://127.0.0.1:{env['MEGA_SERVICE_PORT']}")
                # The settings' environments padded to one size, plus an offset drawn for
                # this replica: one stack layout for every setting of a replica, another
                # for the next replica.
                padded = same_layout(envs, 16 * offsets.randrange(256))
                for setting, env in zip(SETTINGS, padded, strict=True):
                    server = start(
                        ["-m", "chatqna", "serve"],
                        env,
                        root / f"{setting}-{replica}.log",
                        args.server_cpu,
                        fixed_layout=True,
                    )
                    processes.append(server)
                    servers[setting].append(server)
                for setting in SETTINGS:
                    wait_ready(urls[setting][replica])
                    stacks[setting].append(start_of_stack(servers[setting][replica].pid))
            layouts_match = all(
                len({stacks[setting][r] for setting in SETTINGS}) == 1 for r in range(args.replicas)
            )
            print(
                f"stack layout the same for every setting of a replica: {layouts_match}; "
                f"{len({stacks['off'][r] for r in range(args.replicas)})} layouts over "
                f"{args.replicas} replicas",
                file=sys.stderr,
                flush=True,
            )
            print(f"{len(processes) - 1} servers ready", file=sys.stderr, flush=True)
            results: dict[str, list[dict[str, Any]]] = {setting: [] for setting in SETTINGS}
            helpers = [processes[0].pid]
            for setting in SETTINGS:  # warm-up: first-request paths, pools, the tracer
                for url in urls[setting]:
                    asyncio.run(round_of_load(url, 1, args.concurrency))
            run_rounds(results, urls, servers, helpers, args)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=20)
        spans_received = received.span_count()
    summary = {
        setting: {
            "rps_median": statistics.median(r["rps"] for r in rounds),
            "p50_ms_median": statistics.median(r["p50_ms"] for r in rounds),
            "p99_ms_median": statistics.median(r["p99_ms"] for r in rounds),
            "server_cpu_ms_per_request_median": statistics.median(
                r["server_cpu_ms_per_request"] for r in rounds
            ),
            "client_core_share_max": max(r["client_core_share"] for r in rounds),
            "errors": sum(r["errors"] for r in rounds),
            "rounds": rounds,
        }
        for setting, rounds in results.items()
    }
    loads = [r["load_average"] for rounds in results.values() for r in rounds]
    measures = throughput_ratios(results, range(args.rounds))
    ratio, sampled = measures["ratio_on_off"], measures["ratio_sampled_off"]
    paired = {setting: measures[f"paired_ratio_{setting}_off"] for setting in ("on", "sampled")}
    interval = replica_bootstrap(results, min(args.replicas, args.rounds))
    print(
        f"streaming two-turn chats, concurrency {args.concurrency}, {args.rounds} "
        f"{'rounds with every setting at once' if args.together else 'alternating rounds'}"
        f" of {args.seconds:.0f} s on {args.replicas} replicas per setting"
        f"{' (A/A: all untraced)' if args.aa else ''}, stand-in upstreams:"
    )
    print(
        "| tracing | req/s (median) | p50 ms | p99 ms | server CPU ms/request "
        "| client core (max) | errors |"
    )
    print("|---|---|---|---|---|---|---|")
    for setting in SETTINGS:
        s = summary[setting]
        print(
            f"| {setting} | {s['rps_median']:.1f} | {s['p50_ms_median']:.1f} | "
            f"{s['p99_ms_median']:.1f} | {s['server_cpu_ms_per_request_median']:.2f} | "
            f"{s['client_core_share_max']:.2f} | {s['errors']} |"
        )
    print(
        f"throughput vs off, ratio of medians: on {ratio:.3f}, 10% sampled {sampled:.3f}; "
        f"median of paired rounds: on {paired['on']:.3f}, 10% sampled {paired['sampled']:.3f}"
    )
    print(
        "95% intervals over replicas (bootstrap): "
        + "; ".join(f"{name} {low:.3f}-{high:.3f}" for name, (low, high) in interval.items())
    )
    if args.together:
        for setting in SETTINGS:
            shares = [r["server_cpu_share"] for r in results[setting]]
            summary[setting]["server_cpu_share_median"] = statistics.median(shares)
        core = [r["server_core_share"] for r in results["off"]]
        idle = [r["server_core_idle"] for r in results["off"]]
        steal = [r["server_core_steal"] for r in results["off"]]
        print(
            "share of the server core per server (median): "
            + ", ".join(f"{s} {summary[s]['server_cpu_share_median']:.3f}" for s in SETTINGS)
            + f"; the servers together {min(core):.2f} to {max(core):.2f} of it; the core "
            f"idle {min(idle):.3f} to {max(idle):.3f} of a round, taken by the host "
            f"{min(steal):.3f} to {max(steal):.3f}"
        )
    print(f"spans received: {spans_received}; load average {min(loads):.1f} to {max(loads):.1f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "benchmark": "tracing_overhead",
                "command": "tests/rag-benchmarks/tracing_overhead.py " + " ".join(sys.argv[1:]),
                "standins": STANDIN_MODULES[args.standins],
                "server_cpu": args.server_cpu,
                "client_cpu": args.client_cpu,
                "concurrency": args.concurrency,
                "seconds": args.seconds,
                "replicas": args.replicas,
                "aa": args.aa,
                "together": args.together,
                "pause_seconds": PAUSE_SECONDS,
                "warm_seconds": WARM_SECONDS,
                "summary": summary,
                "ratio_sampled_off": sampled,
                "ratio_on_off": ratio,
                "paired_ratio_on_off": paired["on"],
                "paired_ratio_sampled_off": paired["sampled"],
                "interval_95_over_replicas": interval,
                "spans_received": spans_received,
                "start_of_stack": stacks,
                "stack_layout_same_within_replica": layouts_match,
                "load_average": {"min": min(loads), "max": max(loads)},
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
