"""Per-primary BM25 statistics on a Redis Cluster: how far ClapNQ rankings move from one node.

    .venv/bin/python benchmarks/cluster_bm25_stats.py \\
        --dataset path/to/mtrag-clapnq

The 4,841 ClapNQ passages go into one Redis Stack node and into a Redis Cluster of 3
primaries and 3 replicas (both FLAT, exact vectors), with each Wikipedia article (the
passage title) as one source: an article's passages share a hash tag, so the cluster spreads
articles over the primaries as it would spread documents. Each primary computes BM25's IDF
and average passage length from its own passages; one node from all of them. Every scored
turn of the benchmark then runs on both: first turns with the question, follow-ups with the
question and the history-aware BM25 leg (earlier questions at weight 0.3), at the fusion
weights of BM25 alone (0, 1), the service's blend (1, 0.2) and plain RRF (1, 1), k = 10.
Query vectors come from the benchmark's embedding cache (`chatqna bench` fills it).

Per group and weights it prints the mean overlap of the two top 5s, the share of turns
whose top 5 is identical (same ids, same order), Kendall's tau over the passages both top
10s hold, and Recall@5 of each against the labelled passages. Writes
`results/cluster_bm25_stats.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from chatqna.backends.protocols import Retriever, SearchQuery, SourceBatch  # noqa: E402
from chatqna.evaluation.cache import EmbeddingCache  # noqa: E402
from chatqna.evaluation.dataset import Dataset, EvalTurn, Passage, load_dataset  # noqa: E402
from chatqna.multiturn.blend import earlier_questions  # noqa: E402
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex  # noqa: E402
from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams  # noqa: E402
from tests.integration.redis_server import redis_cluster, redis_stack_server  # noqa: E402

HERE = Path(__file__).resolve().parent
EMBEDDER = "all-MiniLM-L6-v2-onnx-int8"
K = 10
HISTORY_WEIGHT = 0.3
WEIGHTS = {"bm25 only (0, 1)": (0.0, 1.0), "blend (1, 0.2)": (1.0, 0.2), "rrf (1, 1)": (1.0, 1.0)}
EXACT = VectorIndexParams(algorithm="FLAT")


def batches(dataset: Dataset, cache: EmbeddingCache) -> list[SourceBatch]:
    """One source per article title, its passages in corpus order."""
    by_title: dict[str, list[Passage]] = defaultdict(list)
    for passage in dataset.passages:
        by_title[passage.title or passage.id].append(passage)
    out = []
    for title, passages in by_title.items():
        chunks = [p.chunk(title, i) for i, p in enumerate(passages)]
        vectors = [cache.get(c.indexed_text) for c in chunks]
        if any(v is None for v in vectors):
            raise SystemExit("the embedding cache lacks passages: run `chatqna bench` first")
        matrix = np.vstack([v for v in vectors if v is not None])
        out.append(SourceBatch(title, chunks, matrix, f"hash-{len(out)}"))
    return out


def turn_queries(turns: Sequence[EvalTurn], cache: EmbeddingCache) -> list[tuple[str, Any]]:
    """(group, turn, query at weights (1, 1)) for every scored turn with a cached vector."""
    out = []
    for turn in turns:
        vector = cache.get(turn.query)
        if vector is None:
            continue
        if turn.is_follow_up:
            history = "\n".join(earlier_questions(turn.conversation()))
            query = SearchQuery(turn.query, vector, K, True, (1.0, 1.0), history, HISTORY_WEIGHT)
            out.append(("follow-ups", (turn, query)))
        else:
            out.append(("first turns", (turn, SearchQuery(turn.query, vector, K))))
    return out


def kendall_tau(first: Sequence[str], second: Sequence[str]) -> float | None:
    """Kendall's tau over the items both rankings hold (None below two)."""
    common = [item for item in first if item in set(second)]
    if len(common) < 2:
        return None
    where = {item: rank for rank, item in enumerate(second)}
    concordant = discordant = 0
    for i in range(len(common)):
        for j in range(i + 1, len(common)):
            if where[common[i]] < where[common[j]]:
                concordant += 1
            else:
                discordant += 1
    return (concordant - discordant) / (concordant + discordant)


def recall_at(ranking: Sequence[str], relevant: Sequence[str], k: int) -> float:
    return len(set(ranking[:k]) & set(relevant)) / len(set(relevant)) if relevant else 0.0


async def compare(
    one: Retriever, many: Retriever, queries: list[tuple[str, Any]]
) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for group, (turn, base) in queries:
        for label, weights in WEIGHTS.items():
            query = SearchQuery(
                base.text, base.embedding, K, True, weights,
                base.bm25_history, base.bm25_history_weight,
            )  # fmt: skip
            a = [r.chunk.id for r in await one.search(query)]
            b = [r.chunk.id for r in await many.search(query)]
            cell = rows[f"{group} / {label}"]
            cell["overlap_at_5"].append(len(set(a[:5]) & set(b[:5])) / 5)
            cell["identical_top_5"].append(float(a[:5] == b[:5]))
            tau = kendall_tau(a, b)
            if tau is not None:
                cell["kendall_tau_top_10"].append(tau)
            cell["recall_at_5_one_node"].append(recall_at(a, turn.relevant_ids, 5))
            cell["recall_at_5_cluster"].append(recall_at(b, turn.relevant_ids, 5))
    return {
        name: {"turns": len(cell["overlap_at_5"])}
        | {metric: round(statistics.fmean(values), 4) for metric, values in cell.items()}
        for name, cell in rows.items()
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    dataset = load_dataset(args.dataset)
    cache = EmbeddingCache(args.cache_dir, EMBEDDER)
    sources = batches(dataset, cache)
    queries = turn_queries(dataset.scored_turns, cache)
    dimension = int(sources[0].embeddings.shape[1])
    with (
        tempfile.TemporaryDirectory(prefix="cluster-bm25-") as tmp,
        redis_stack_server(Path(tmp) / "one") as single,
        redis_cluster(Path(tmp) / "cluster") as cluster,
    ):
        one = await RedisHybridIndex.open(
            single.url, embedder_name=EMBEDDER, dimension=dimension, vector=EXACT
        )
        many = await RedisClusterHybridIndex.open(
            cluster.url, embedder_name=EMBEDDER, dimension=dimension, vector=EXACT
        )
        try:
            for index in (one, many):
                for start in range(0, len(sources), 200):
                    await index.replace_sources(sources[start : start + 200])
            described = await many.describe()
            per_primary = []
            for shard in many.topology.primaries:
                info = await many.topology.client(shard.address).execute_command(  # type: ignore[no-untyped-call]
                    "FT.INFO", shard.index
                )
                fields = dict(zip(info[::2], info[1::2], strict=False))
                per_primary.append(int(fields[b"num_docs"]))
            results = await compare(one, many, queries)
        finally:
            await one.aclose()
            await many.aclose()
    return {
        "dataset": dataset.name,
        "passages": described["chunks"],
        "sources": len(sources),
        "passages_per_primary": sorted(per_primary),
        "k": K,
        "history_weight": HISTORY_WEIGHT,
        "python": platform.python_version(),
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dataset",
        type=Path,
        required=True,
        help="MTRAG's ClapNQ dataset: a directory holding corpus.jsonl and "
        "conversations.jsonl (see 'Getting the datasets' in site/docs/benchmarks.md)",
    )
    parser.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "cluster_bm25_stats.json")
    args = parser.parse_args()
    start_run()
    result = asyncio.run(run(args))
    print(
        f"{result['passages']} passages in {result['sources']} sources; per primary "
        f"{result['passages_per_primary']}; k={K}"
    )
    print("| turns / weights | n | overlap@5 | identical top 5 | tau top 10 | R@5 one | R@5 cl |")
    print("|---|---|---|---|---|---|---|")
    for name, r in result["results"].items():
        print(
            f"| {name} | {r['turns']} | {r['overlap_at_5']:.3f} | {r['identical_top_5']:.3f} "
            f"| {r.get('kendall_tau_top_10', float('nan')):.3f} "
            f"| {r['recall_at_5_one_node']:.3f} | {r['recall_at_5_cluster']:.3f} |"
        )
    write_result(args.output, result)
    print(f"written to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
