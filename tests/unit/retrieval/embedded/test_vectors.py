"""The in-memory vector set: appends, removals, positions, exact top k (float32 and the
rescored int8 scan), quantization, compaction."""

from __future__ import annotations

import numpy as np

from chatqna.retrieval.embedded.vectors import VectorSet, quantize, scan_candidates


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
    positions, scores = current.search(vectors[0], 10)  # row 1's own vector would rank first
    assert len(positions) == 4 and 0 not in positions.tolist()
    exact = np.argsort(-(vectors[1:] @ vectors[0]), kind="stable") + 1
    assert positions.tolist() == exact.tolist()
    assert np.allclose(scores, vectors[positions] @ vectors[0])


def test_top_k_is_exact_and_ordered() -> None:
    vectors = unit(200, seed=3)
    current = VectorSet.empty(8).apply(np.arange(1, 201, dtype=np.int64), vectors, ids())
    query = unit(1, seed=4)[0]
    expected = np.argsort(-(vectors @ query), kind="stable")[:7]
    assert current.search(query, 7)[0].tolist() == expected.tolist()


def wide(rows: int, seed: int) -> np.ndarray:
    matrix = np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def test_the_int8_scan_finds_the_exact_top_k_and_exact_scores() -> None:
    vectors = wide(5000, seed=7)
    current = VectorSet.empty(64).apply(np.arange(1, 5001, dtype=np.int64), vectors, ids())
    assert current.size > scan_candidates(10)  # the scan path, not the small-set one
    for seed in range(20):
        query = wide(1, seed=100 + seed)[0]
        exact = vectors @ query
        positions, scores = current.search(query, 10)
        assert positions.tolist() == np.argsort(-exact, kind="stable")[:10].tolist()
        assert np.allclose(scores, exact[positions], atol=1e-6)


def test_the_int8_scan_skips_removed_rows() -> None:
    vectors = wide(3000, seed=8)
    rows = np.arange(1, 3001, dtype=np.int64)
    current = VectorSet.empty(64).apply(rows, vectors, ids())
    query = vectors[17]
    best = current.search(query, 5)[0]
    current = current.apply(ids(), np.zeros((0, 64), np.float32), rows[best[:3]])
    again = current.search(query, 5)[0]
    assert not set(again.tolist()) & set(best[:3].tolist())
    assert again[:2].tolist() == best[3:].tolist()


def test_quantize_codes_each_row_on_its_own_scale() -> None:
    vectors = np.vstack([wide(3, seed=9), 1e-3 * wide(1, seed=10), np.zeros((1, 64))])
    codes, scales = quantize(vectors.astype(np.float32))
    assert codes.dtype == np.int8 and np.abs(codes[:4]).max(axis=1).tolist() == [127] * 4
    assert np.allclose(codes * scales[:, None], vectors, atol=scales.max() / 2 + 1e-9)
    assert not codes[4].any()


def test_rescore_orders_candidates_and_drops_missing_rows() -> None:
    vectors = wide(50, seed=11)
    current = VectorSet.empty(64).apply(np.arange(1, 51, dtype=np.int64), vectors, ids(4))
    current = current.apply(ids(), np.zeros((0, 64), np.float32), ids(7))
    query = wide(1, seed=12)[0]
    positions, scores = current.rescore(query, ids(3, 7, 9, 9, 99, 20, 1), 3)
    candidates = [2, 8, 19, 0]  # rows 3, 9, 20, 1 (7 removed, 99 unknown)
    exact = vectors[candidates] @ query
    assert positions.tolist() == [candidates[i] for i in np.argsort(-exact)[:3]]
    assert np.allclose(scores, np.sort(exact)[::-1][:3])


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
