"""What the history-aware BM25 leg adds to the retrieval stage of a follow-up turn.

    .venv/bin/python benchmarks/bm25_history_overhead.py \\
        --dataset path/to/mtrag-clapnq [--rounds 5] [--no-redis]

The corpus of the dataset (4,841 ClapNQ passages) is indexed in the embedded index and, with
`--redis` (the default), in a fresh Redis Stack (FLAT vectors). For every follow-up turn the
retrieval stage runs as the service runs it (`Retriever.search`: hybrid, fusion weights 1
and 0.2, 50 passages per leg, k = 4), once with the plain BM25 leg and once with the
history-aware one (the user's earlier questions at weight 0.3), alternating, `--rounds`
times. Query vectors come from the benchmark's embedding cache (the blended vector when it
is there). Searches on the embedded index include its `asyncio.to_thread` hop; Redis
searches include the loopback round trips. Prints medians and p95 per variant, the median of
the paired differences (the two variants of a follow-up run back to back, which cancels
most of a shared machine's noise) and the added share (that difference over the plain
median), and writes `results/bm25_history_overhead.json` (or `--output`). The bound it checks:
the leg adds no more than 10% to the stage.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from chatqna.backends.protocols import Retriever, SearchQuery, SourceBatch  # noqa: E402
from chatqna.evaluation.cache import EmbeddingCache  # noqa: E402
from chatqna.evaluation.dataset import Dataset, EvalTurn, load_dataset  # noqa: E402
from chatqna.multiturn.blend import earlier_questions  # noqa: E402
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex  # noqa: E402
from chatqna.retrieval.fusion import FUSION_CANDIDATES  # noqa: E402
from chatqna.retrieval.query import WeightedQuery  # noqa: E402
from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams  # noqa: E402
from tests.integration.redis_server import redis_stack_server  # noqa: E402

HERE = Path(__file__).resolve().parent
EMBEDDER = "all-MiniLM-L6-v2-onnx-int8"
K = 4
WEIGHTS = (1.0, 0.2)
HISTORY_WEIGHT = 0.3


def corpus(dataset: Dataset, cache: EmbeddingCache) -> SourceBatch:
    chunks = [p.chunk(dataset.name, i) for i, p in enumerate(dataset.passages)]
    rows = [cache.get(c.indexed_text) for c in chunks]
    if any(row is None for row in rows):
        raise SystemExit("the embedding cache lacks passages: run `chatqna bench` on it first")
    return SourceBatch(dataset.name, chunks, np.vstack([r for r in rows if r is not None]))


def queries(
    turns: Sequence[EvalTurn], cache: EmbeddingCache
) -> list[tuple[SearchQuery, SearchQuery]]:
    """(plain BM25, history-aware BM25) pairs, one per follow-up with earlier questions."""
    pairs = []
    for turn in turns:
        questions = earlier_questions(turn.conversation())
        vector = cache.get(turn.query)
        if not turn.is_follow_up or not questions or vector is None:
            continue
        plain = SearchQuery(turn.query, vector, K, True, WEIGHTS)
        aware = SearchQuery(
            turn.query, vector, K, True, WEIGHTS, "\n".join(questions), HISTORY_WEIGHT
        )
        pairs.append((plain, aware))
    return pairs


async def measure(
    retriever: Retriever, pairs: list[tuple[SearchQuery, SearchQuery]], rounds: int
) -> dict[str, Any]:
    for plain, aware in pairs[:10]:  # warm up
        await retriever.search(plain)
        await retriever.search(aware)
    samples: dict[str, list[float]] = {"plain": [], "history_aware": []}
    for round_ in range(rounds):
        for plain, aware in pairs:
            order = [("plain", plain), ("history_aware", aware)]
            for name, query in order if round_ % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                await retriever.search(query)
                samples[name].append((time.perf_counter() - started) * 1000)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    p95 = {k: sorted(v)[int(0.95 * (len(v) - 1))] for k, v in samples.items()}
    # Each pair ran back to back on the same follow-up: its difference cancels most of the
    # noise of a shared machine.
    paired = [a - p for p, a in zip(samples["plain"], samples["history_aware"], strict=True)]
    return {
        "searches_per_variant": len(samples["plain"]),
        "median_ms": {k: round(v, 3) for k, v in medians.items()},
        "p95_ms": {k: round(v, 3) for k, v in p95.items()},
        "mean_ms": {k: round(statistics.fmean(v), 3) for k, v in samples.items()},
        "paired_difference_median_ms": round(statistics.median(paired), 4),
        "added_share_paired": round(statistics.median(paired) / medians["plain"], 4),
        "added_share_median": round(medians["history_aware"] / medians["plain"] - 1, 4),
        "added_share_mean": round(
            statistics.fmean(samples["history_aware"]) / statistics.fmean(samples["plain"]) - 1, 4
        ),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dataset",
        type=Path,
        required=True,
        help="MTRAG's ClapNQ dataset: a directory holding corpus.jsonl and "
        "conversations.jsonl (see 'Getting the datasets' in site/docs/benchmarks.md)",
    )
    parser.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--output", type=Path, default=HERE / "results" / "bm25_history_overhead.json"
    )
    args = parser.parse_args()
    start_run()
    dataset = load_dataset(args.dataset)
    cache = EmbeddingCache(args.cache_dir, EMBEDDER)
    batch = corpus(dataset, cache)
    pairs = queries(dataset.scored_turns, cache)
    history_terms = [
        len(WeightedQuery.parse(a.text, a.bm25_history, HISTORY_WEIGHT).history_terms)
        for _, a in pairs
    ]
    results: dict[str, Any] = {
        "dataset": dataset.name,
        "passages": len(batch.chunks),
        "follow_ups": len(pairs),
        "rounds": args.rounds,
        "k": K,
        "candidates_per_leg": FUSION_CANDIDATES,
        "fusion_weights": list(WEIGHTS),
        "history_weight": HISTORY_WEIGHT,
        "history_terms_median": statistics.median(history_terms),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "stores": {},
    }
    with tempfile.TemporaryDirectory() as directory:
        embedded = await EmbeddedHybridIndex.open(
            Path(directory), embedder_name=EMBEDDER, dimension=384
        )
        await embedded.replace_sources([batch])
        results["stores"]["embedded"] = await measure(embedded, pairs, args.rounds)
        if args.redis:
            with redis_stack_server(Path(directory) / "redis") as server:
                redis_index = await RedisHybridIndex.open(
                    server.url,
                    embedder_name=EMBEDDER,
                    dimension=384,
                    vector=VectorIndexParams(algorithm="FLAT"),
                )
                try:
                    await redis_index.replace_sources([batch])
                    results["stores"]["redis (FLAT)"] = await measure(
                        redis_index, pairs, args.rounds
                    )
                finally:
                    await redis_index.aclose()
    print(
        f"{results['follow_ups']} follow-ups x {args.rounds} rounds, {results['passages']} passages"
    )
    print(
        "| store | plain BM25 median ms | history-aware median ms | p95 plain | p95 aware "
        "| paired difference, median ms | added (paired) | added (medians) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, row in results["stores"].items():
        median, p95 = row["median_ms"], row["p95_ms"]
        print(
            f"| {name} | {median['plain']:.3f} | {median['history_aware']:.3f} | "
            f"{p95['plain']:.3f} | {p95['history_aware']:.3f} | "
            f"{row['paired_difference_median_ms']:+.3f} | {row['added_share_paired']:+.1%} | "
            f"{row['added_share_median']:+.1%} |"
        )
    write_result(args.output, results)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
