"""The in-memory vector set: appends, removals, positions, exact top k, compaction."""

from __future__ import annotations

import numpy as np

from chatqna.retrieval.vectors import VectorSet


def unit(rows: int, seed: int = 0) -> np.ndarray:
    matrix = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def ids(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def test_apply_appends_and_positions_find_rows() -> None:
    vectors = unit(4)
    first = VectorSet.empty(8).apply(ids(3, 5, 9, 12), vectors, ids())
    assert first.size == first.live == 4 and first.last_row == 12
    assert first.positions(ids(9, 3, 4, 13)).tolist() == [2, 0, -1, -1]
    assert np.array_equal(first.matrix, vectors)


def test_a_set_is_unchanged_by_the_next_one() -> None:
    first = VectorSet.empty(8).apply(ids(1, 2), unit(2), ids())
    second = first.apply(ids(3), unit(1, seed=1), ids(1))
    assert first.size == 2 and first.live == 2 and first.positions(ids(1)).tolist() == [0]
    assert second.size == 3 and second.live == 2
    assert second.positions(ids(1, 2, 3)).tolist() == [-1, 1, 2]


def test_removed_rows_never_rank() -> None:
    vectors = unit(5)
    current = VectorSet.empty(8).apply(ids(1, 2, 3, 4, 5), vectors, ids())
    current = current.apply(ids(), np.zeros((0, 8), np.float32), ids(1, 99))
    scores = current.cosine(vectors[0])  # row 1's own vector: it would rank first
    assert scores[0] == -np.inf
    top = current.top(scores, 10)
    assert len(top) == 4 and 0 not in top.tolist()
    exact = np.argsort(-(vectors[1:] @ vectors[0]), kind="stable") + 1
    assert top.tolist() == exact.tolist()


def test_top_k_is_exact_and_ordered() -> None:
    vectors = unit(200, seed=3)
    current = VectorSet.empty(8).apply(np.arange(1, 201, dtype=np.int64), vectors, ids())
    query = unit(1, seed=4)[0]
    scores = current.cosine(query)
    expected = np.argsort(-(vectors @ query), kind="stable")[:7]
    assert current.top(scores, 7).tolist() == expected.tolist()


def test_many_removals_compact_the_buffer() -> None:
    rows = np.arange(1, 5001, dtype=np.int64)
    vectors = unit(5000, seed=5)
    current = VectorSet.empty(8).apply(rows, vectors, ids())
    current = current.apply(ids(), np.zeros((0, 8), np.float32), rows[:2000])
    assert current.size == current.live == 3000  # a quarter dead: compacted
    assert current.rows.tolist() == rows[2000:].tolist()
    assert np.array_equal(current.matrix, vectors[2000:])


def test_growth_keeps_earlier_rows() -> None:
    current = VectorSet.empty(8)
    blocks = [unit(700, seed=s) for s in range(4)]
    for number, block in enumerate(blocks):
        start = number * 700 + 1
        current = current.apply(np.arange(start, start + 700, dtype=np.int64), block, ids())
    assert current.size == 2800 and len(current.buffer) >= 2800
    assert np.array_equal(current.matrix, np.vstack(blocks))
