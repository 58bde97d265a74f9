"""Ingestion throughput and the per-stage latency of one chat turn on the embedded default.

    .venv/bin/python benchmarks/turn_latency.py [--repeat 20] [--max-tokens 32]

Builds the real embedded backends (ONNX MiniLM, the SQLite + tantivy index, the reranker
the settings choose: none by default, llama.cpp on the packaged GGUF) in a temporary data
directory, ingests the sample corpus (timed), then runs the same two-turn chat `--repeat`
times through one `Pipeline` (built once, as the service builds it) and the streamed
generation, and prints the median and p95 per stage. Other settings come from the
environment (the quick start's `MULTI_TURN_BLEND_ENABLED=true`, say); the ones that shape a
turn are saved with the figures. Results are written as JSON next to this script
(`results/turn_latency.json`) unless `--output` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

from chatqna.backends.protocols import GenerationParams
from chatqna.composition import build_backends
from chatqna.ingest.dataprep import collect_files, ingest_files
from chatqna.multiturn.history import Message
from chatqna.pipeline.orchestrator import Pipeline
from chatqna.pipeline.turn import TurnOptions
from chatqna.settings import Settings

REPO = Path(__file__).resolve().parents[1]
CHAT = [
    Message("user", "How do I export my data?"),
    Message("assistant", "Open Settings > Workspace > Export and pick a format."),
    Message("user", "Is that possible after I cancel?"),
]
STAGES = ("embed", "retrieve", "rerank", "first_token", "generate", "total")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[position]


async def run(repeat: int, max_tokens: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(chatqna_data_dir=Path(data_dir))
        started = time.perf_counter()
        backends = await build_backends(settings)
        startup_s = time.perf_counter() - started
        reranker = backends.reranker.name if backends.reranker is not None else None
        try:
            files = collect_files([REPO / "chatqna" / "sample_corpus"])
            started = time.perf_counter()
            results = await ingest_files(files, backends.embedder, backends.retriever)
            ingest_s = time.perf_counter() - started
            chunks = sum(r.chunks for r in results)
            options = TurnOptions.from_settings(
                settings, params=GenerationParams(max_tokens=max_tokens, temperature=0.0)
            )
            pipeline = Pipeline.build(settings, backends)
            samples: dict[str, list[float]] = {stage: [] for stage in STAGES}
            for _ in range(repeat + 1):  # the first run warms caches and is dropped
                turn = await pipeline.prepare(CHAT, options)
                async with turn:
                    async for _delta in turn.stream():
                        pass
                for stage in STAGES:
                    samples[stage].append(turn.clock.stages.get(stage, 0.0))
            samples = {stage: values[1:] for stage, values in samples.items()}
        finally:
            await backends.aclose()
    return {
        "settings": {
            "multi_turn_mode": settings.multi_turn_mode,
            "multi_turn_blend_enabled": settings.multi_turn_blend_enabled,
            "reranker": reranker,
            "retriever_k": settings.retriever_k,
            "rerank_top_n": settings.rerank_top_n,
        },
        "startup_s": round(startup_s, 3),
        "ingest": {
            "files": len(files),
            "chunks": chunks,
            "seconds": round(ingest_s, 3),
            "chunks_per_s": round(chunks / ingest_s, 1),
        },
        "turn": {
            "repeat": repeat,
            "max_tokens": max_tokens,
            "median_ms": {s: round(statistics.median(v), 2) for s, v in samples.items()},
            "p95_ms": {s: round(percentile(v, 0.95), 2) for s, v in samples.items()},
        },
    }


def print_table(result: dict[str, Any]) -> None:
    ingest = result["ingest"]
    print(f"start-up (load models, open index): {result['startup_s']:.2f} s")
    print(
        f"ingestion: {ingest['files']} files, {ingest['chunks']} chunks in "
        f"{ingest['seconds']:.2f} s = {ingest['chunks_per_s']:.1f} chunks/s"
    )
    turn = result["turn"]
    print(f"\none turn ({turn['repeat']} runs, max_tokens={turn['max_tokens']}):")
    print(f"| {'stage':<12} | {'median ms':>10} | {'p95 ms':>10} |")
    print(f"|{'-' * 14}|{'-' * 12}|{'-' * 12}|")
    for stage in STAGES:
        median, p95 = turn["median_ms"][stage], turn["p95_ms"][stage]
        if median == p95 == 0.0:  # a stage that did not run (no reranker, say)
            continue
        print(f"| {stage:<12} | {median:>10.2f} | {p95:>10.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "turn_latency.json"
    )
    args = parser.parse_args()
    start_run()
    result = asyncio.run(run(args.repeat, args.max_tokens))
    print_table(result)
    write_result(args.output, result)
    print(f"\nwritten to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
