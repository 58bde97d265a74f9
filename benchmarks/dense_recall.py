"""Recall of the embedded index's dense search paths on real embeddings (ClapNQ, MiniLM).

    .venv/bin/python benchmarks/dense_recall.py \
        --dataset path/to/mtrag-clapnq [--cache-dir benchmarks/.cache]

The corpus is the dataset's passages (one vector each, as `chatqna bench` indexes them) and
the queries are the user questions of its scored turns, all embedded by the embedded
default (all-MiniLM-L6-v2, int8 ONNX), read from the benchmark's embedding cache where
`chatqna bench` already put them (the rest are embedded and cached). Ground truth is exact
float32 search (one matrix-vector product). Against it, for the best 10 and the best 50:

- the int8 scan rescored in float32 (`VectorSet.search`, the dense leg up to
  `CHATQNA_EMBEDDED_EXACT_MAX_CHUNKS`);
- the HNSW graph rescored in float32 (`VectorGraph`, beyond that size), at the shipped
  search expansion and at half and twice it;
- the int8 scan alone, without the rescoring, to show what the rescoring buys.

Recall counts a returned passage as found when its exact score is at least the k-th exact
score (so equal-scoring duplicates, of which ClapNQ has some, do not count as misses).
Prints a table and writes `results/dense_recall.json`. The corpus is small (4,841
passages): the graph's recall here is an upper bound for a corpus a hundred times larger,
and random vectors (`index_scale.py`) are a lower bound no real corpus approaches.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import numkong  # noqa: E402
import numpy as np  # noqa: E402

from chatqna.backends.vectors import l2_normalise  # noqa: E402
from chatqna.composition import build_embedder  # noqa: E402
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache  # noqa: E402
from chatqna.evaluation.dataset import load_dataset  # noqa: E402
from chatqna.retrieval.embedded import vector_graph  # noqa: E402
from chatqna.retrieval.embedded.vector_graph import VectorGraph  # noqa: E402
from chatqna.retrieval.embedded.vectors import VectorSet, quantize, scan_candidates  # noqa: E402
from chatqna.settings import Settings  # noqa: E402


async def embed(texts: list[str], cache_dir: Path) -> np.ndarray:
    raw = await build_embedder(Settings())
    cache = EmbeddingCache(cache_dir, raw.name)
    embedder = CachingEmbedder(raw, cache)
    try:
        rows = []
        for start in range(0, len(texts), 64):
            rows.append(await embedder.embed(texts[start : start + 64]))
            if start and start % 1024 == 0:
                print(f"  embedded {start}/{len(texts)}", file=sys.stderr)
    finally:
        cache.save()
        await raw.aclose()
    return l2_normalise(np.vstack(rows).astype(np.float32))


def recall(matrix: np.ndarray, query: np.ndarray, found: np.ndarray, k: int) -> float:
    exact = matrix @ query
    kth = np.partition(exact, len(exact) - k)[len(exact) - k]
    return float(np.mean(exact[found[:k]] >= kth - 1e-6)) if len(found) else 0.0


def int8_only(vectors: VectorSet, query: np.ndarray, k: int) -> np.ndarray:
    codes, _ = quantize(query.reshape(1, -1))
    dots = np.asarray(
        numkong.cdist(codes, vectors.codes[: vectors.size], metric="dot", out_dtype="float32")
    )
    approximate = dots.reshape(-1) * vectors.scales[: vectors.size]
    return np.argsort(-approximate, kind="stable")[:k]


def measure(name: str, search: Any, matrix: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    row: dict[str, Any] = {"path": name}
    for k in (10, 50):
        recalls, latencies = [], []
        for query in queries:
            started = time.perf_counter()
            found = search(query, k)
            latencies.append((time.perf_counter() - started) * 1000)
            recalls.append(recall(matrix, query, found, k))
        row[f"recall_at_{k}"] = round(statistics.fmean(recalls), 4)
        row[f"recall_at_{k}_min"] = round(min(recalls), 2)
        row[f"p50_ms_at_{k}"] = round(statistics.median(latencies), 3)
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    dataset = load_dataset(args.dataset)
    passages = [p.indexed_text() for p in dataset.passages]
    questions = list(dict.fromkeys(turn.query for turn in dataset.scored_turns))
    print(f"{len(passages)} passages, {len(questions)} questions", file=sys.stderr)
    matrix = await embed(passages, args.cache_dir)
    queries = await embed(questions, args.cache_dir)
    rows_ids = np.arange(1, len(matrix) + 1, dtype=np.int64)
    vectors = VectorSet.empty(matrix.shape[1]).apply(rows_ids, matrix, np.zeros(0, np.int64))
    rows = [
        measure(
            "int8 scan, rescored (exact size and below)",
            lambda q, k: vectors.search(q, k)[0],
            matrix,
            queries,
        ),
        measure(
            "int8 scan alone (no rescoring)", lambda q, k: int8_only(vectors, q, k), matrix, queries
        ),
    ]
    started = time.perf_counter()
    graph = VectorGraph(matrix.shape[1], threads=1)
    graph.add(rows_ids, matrix)
    build_s = time.perf_counter() - started
    shipped = vector_graph.EXPANSION_SEARCH
    for expansion in (shipped // 2, shipped, shipped * 2):
        graph._index.expansion_search = expansion
        label = f"HNSW graph, rescored, expansion {expansion}" + (
            " (shipped)" if expansion == shipped else ""
        )

        def search(query: np.ndarray, k: int) -> np.ndarray:
            return vectors.rescore(query, graph.search(query, scan_candidates(k)), k)[0]

        rows.append({**measure(label, search, matrix, queries), "build_s": round(build_s, 2)})
    return {
        "dataset": dataset.name,
        "passages": len(passages),
        "questions": len(questions),
        "scan_candidates": {"10": scan_candidates(10), "50": scan_candidates(50)},
        "graph": {
            "connectivity": vector_graph.CONNECTIVITY,
            "expansion_add": vector_graph.EXPANSION_ADD,
            "memory_bytes": graph.memory_bytes,
        },
        "versions": {
            name: importlib.metadata.version(name) for name in ("numpy", "numkong", "usearch")
        },
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dataset",
        type=Path,
        required=True,
        help="MTRAG's ClapNQ dataset: a directory holding corpus.jsonl and "
        "conversations.jsonl (see 'Getting the datasets' in site/docs/benchmarks.md)",
    )
    parser.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "dense_recall.json")
    args = parser.parse_args()
    start_run()
    result = asyncio.run(run(args))
    print(
        f"{result['dataset']}: {result['passages']:,} passages, {result['questions']:,} "
        "questions, MiniLM embeddings; recall against exact float32 search"
    )
    print("| dense path | recall@10 | min | recall@50 | min | p50 ms (k=50) |")
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(
            f"| {r['path']} | {r['recall_at_10']:.4f} | {r['recall_at_10_min']:.2f} | "
            f"{r['recall_at_50']:.4f} | {r['recall_at_50_min']:.2f} | {r['p50_ms_at_50']:.3f} |"
        )
    write_result(args.output, result)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
