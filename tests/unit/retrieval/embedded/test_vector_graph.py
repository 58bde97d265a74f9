"""The HNSW graph of the embedded index's large sizes: adds, removals, nearest rows."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np

from chatqna.retrieval.embedded.vector_graph import VectorGraph


def clustered(rows: int, seed: int) -> np.ndarray:
    """Unit vectors around 20 centres: neighbourhoods a graph can find (random ones have none)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, 32))
    matrix = centres[rng.integers(0, 20, rows)] + 0.3 * rng.standard_normal((rows, 32))
    return (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)


def test_the_graph_returns_the_nearest_rows_by_row_id() -> None:
    vectors = clustered(3000, seed=1)
    rows = np.arange(100, 3100, dtype=np.int64)
    graph = VectorGraph(32)
    graph.add(rows, vectors)
    assert len(graph) == 3000 and graph.memory_bytes > 0
    recalls = []
    for number in range(30):
        query = vectors[number * 50]
        exact = set(rows[np.argsort(-(vectors @ query))[:10]].tolist())
        found = graph.search(query, 40)
        assert found.dtype == np.int64 and set(found.tolist()) <= set(rows.tolist())
        recalls.append(len(exact & set(found.tolist())) / 10)
    assert np.mean(recalls) >= 0.95


def test_removed_rows_are_not_returned() -> None:
    vectors = clustered(500, seed=2)
    rows = np.arange(1, 501, dtype=np.int64)
    graph = VectorGraph(32)
    graph.add(rows, vectors)
    graph.remove(np.asarray([1, 2, 3, 9999], dtype=np.int64))  # an unknown row is ignored
    assert len(graph) == 497
    assert not {1, 2, 3} & set(graph.search(vectors[0], 50).tolist())


def test_an_empty_graph_finds_nothing() -> None:
    assert VectorGraph(32).search(np.ones(32, np.float32), 5).tolist() == []


def test_searches_run_while_another_thread_adds() -> None:
    vectors = clustered(20000, seed=3)
    rows = np.arange(1, 20001, dtype=np.int64)
    graph = VectorGraph(32)
    graph.add(rows[:1000], vectors[:1000])
    adding = threading.Thread(target=graph.add, args=(rows[1000:], vectors[1000:]))
    adding.start()
    seen = []
    while adding.is_alive():
        seen.append(len(graph.search(vectors[0], 10)))
    adding.join()
    assert seen and min(seen) == 10 and len(graph) == 20000


def test_the_graph_library_and_the_embedder_runtime_load_in_either_order() -> None:
    # usearch 2.26 crashed the process (SIGSEGV) when it was imported before onnxruntime.
    for first, second in (("usearch.index", "onnxruntime"), ("onnxruntime", "usearch.index")):
        loaded = subprocess.run(
            [sys.executable, "-c", f"import {first}; import {second}"],
            capture_output=True,
            timeout=120,
        )
        assert loaded.returncode == 0, (first, second, loaded.stderr[-500:])
