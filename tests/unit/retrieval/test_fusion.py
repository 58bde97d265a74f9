"""Reciprocal rank fusion: hand-computed scores, weights, deterministic ties, bad arguments."""

from __future__ import annotations

import pytest

from chatqna.retrieval.fusion import DEFAULT_RRF_K, reciprocal_rank_fusion


def test_default_k_is_the_papers_constant() -> None:
    assert DEFAULT_RRF_K == 60


def test_two_lists_hand_computed_with_k_60() -> None:
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["d", "e", "a"]])
    expected = {
        "a": 1 / 61 + 1 / 63,  # rank 1 of A, rank 3 of B
        "b": 1 / 62,
        "c": 1 / 63,
        "d": 1 / 61,
        "e": 1 / 62,
    }
    assert [item for item, _ in fused] == ["a", "d", "b", "e", "c"]
    assert len(fused) == len(expected)
    for item, score in fused:
        assert score == pytest.approx(expected[item], rel=1e-12)


def test_agreement_beats_a_single_first_place() -> None:
    # "x" is second in both lists; "a" and "b" are each first in only one.
    fused = reciprocal_rank_fusion([["a", "x"], ["b", "x"]])
    assert fused[0] == ("x", pytest.approx(2 / 62))
    assert [item for item, _ in fused] == ["x", "a", "b"]


def test_custom_k_changes_scores() -> None:
    fused = dict(reciprocal_rank_fusion([["a", "b"], ["b"]], k=1))
    assert fused["a"] == pytest.approx(1 / 2)
    assert fused["b"] == pytest.approx(1 / 3 + 1 / 2)


def test_weights_scale_each_lists_contribution() -> None:
    fused = reciprocal_rank_fusion([["a", "b"], ["b", "a"]], weights=[3.0, 1.0])
    scores = dict(fused)
    assert scores["a"] == pytest.approx(3 / 61 + 1 / 62)
    assert scores["b"] == pytest.approx(3 / 62 + 1 / 61)
    assert [item for item, _ in fused] == ["a", "b"]
    # Flipping the weights flips the winner.
    flipped = reciprocal_rank_fusion([["a", "b"], ["b", "a"]], weights=[1.0, 3.0])
    assert [item for item, _ in flipped] == ["b", "a"]


def test_zero_weight_list_contributes_nothing() -> None:
    scores = dict(reciprocal_rank_fusion([["a"], ["b"]], weights=[1.0, 0.0]))
    assert scores["a"] == pytest.approx(1 / 61)
    assert scores["b"] == 0.0


def test_ties_keep_first_seen_order() -> None:
    # Every item has exactly 1/61 or 1/62: ties within each score are broken by first sight.
    fused = reciprocal_rank_fusion([["p", "q"], ["r", "s"], ["t"]])
    assert [item for item, _ in fused] == ["p", "r", "t", "q", "s"]
    # The same symmetric input in the other order gives the other order.
    swapped = reciprocal_rank_fusion([["r", "s"], ["p", "q"], ["t"]])
    assert [item for item, _ in swapped] == ["r", "p", "t", "s", "q"]


def test_exact_tie_from_mirrored_lists_keeps_first_list_first() -> None:
    fused = reciprocal_rank_fusion([["a", "b"], ["b", "a"]])
    assert fused[0][1] == fused[1][1]
    assert [item for item, _ in fused] == ["a", "b"]


def test_empty_inputs() -> None:
    assert reciprocal_rank_fusion([]) == []
    assert reciprocal_rank_fusion([[], []]) == []
    assert reciprocal_rank_fusion([[], ["a"]]) == [("a", pytest.approx(1 / 61))]


@pytest.mark.parametrize("k", [0, -1, -60])
def test_k_below_one_is_rejected(k: int) -> None:
    with pytest.raises(ValueError, match="k must be at least 1"):
        reciprocal_rank_fusion([["a"]], k=k)


def test_k_of_one_is_accepted() -> None:
    assert reciprocal_rank_fusion([["a"]], k=1) == [("a", pytest.approx(0.5))]


@pytest.mark.parametrize("weights", [[1.0], [1.0, 1.0, 1.0], []])
def test_weight_count_mismatch_is_rejected(weights: list[float]) -> None:
    with pytest.raises(ValueError, match="one weight per ranking"):
        reciprocal_rank_fusion([["a"], ["b"]], weights=weights)
