"""Metrics against values computed by hand on a tiny example."""

from __future__ import annotations

import math

import pytest

from chatqna.evaluation.metrics import (
    bootstrap_ci,
    hit_at_k,
    ndcg_at_k,
    paired_bootstrap,
    recall_at_k,
    summarise,
    turn_metrics,
)

RANKING = ["d3", "d1", "d7", "d2", "d9"]


def test_single_relevant_passage() -> None:
    assert recall_at_k(RANKING, ["d1"], 1) == 0.0
    assert recall_at_k(RANKING, ["d1"], 3) == 1.0
    assert hit_at_k(RANKING, ["d1"], 1) == 0.0 and hit_at_k(RANKING, ["d1"], 2) == 1.0
    # d1 at rank 2: DCG = 1/log2(3); ideal = 1/log2(2) = 1.
    assert ndcg_at_k(RANKING, ["d1"], 5) == pytest.approx(1 / math.log2(3))


def test_several_relevant_passages() -> None:
    relevant = ["d1", "d2", "d8"]
    # Ranks 2 and 4 are relevant; d8 is never retrieved.
    assert recall_at_k(RANKING, relevant, 3) == pytest.approx(1 / 3)
    assert recall_at_k(RANKING, relevant, 5) == pytest.approx(2 / 3)
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(RANKING, relevant, 5) == pytest.approx(dcg / ideal)
    # At k=1 the ideal holds one relevant passage, the ranking none.
    assert ndcg_at_k(RANKING, relevant, 1) == 0.0


def test_relevant_id_missing_from_the_corpus_still_counts() -> None:
    # "ghost" is labelled relevant but does not exist: recall can reach only 1/2.
    assert recall_at_k(RANKING, ["d3", "ghost"], 10) == 0.5
    assert ndcg_at_k(RANKING, ["d3", "ghost"], 10) == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_duplicate_labels_and_short_rankings() -> None:
    assert recall_at_k(["d1"], ["d1", "d1"], 10) == 1.0
    assert recall_at_k([], ["d1"], 10) == 0.0 and ndcg_at_k([], ["d1"], 10) == 0.0


def test_ties_are_resolved_by_the_ranking_order() -> None:
    # Two passages tied in score come in the retriever's stable order; the metric reads
    # positions, so swapping the tied pair changes nDCG but never recall at a larger k.
    first, second = ["d1", "d2", "d3"], ["d2", "d1", "d3"]
    assert recall_at_k(first, ["d2"], 2) == recall_at_k(second, ["d2"], 2) == 1.0
    assert ndcg_at_k(first, ["d2"], 2) == pytest.approx(1 / math.log2(3))
    assert ndcg_at_k(second, ["d2"], 2) == 1.0


def test_no_relevant_ids_cannot_be_scored() -> None:
    with pytest.raises(ValueError):
        recall_at_k(RANKING, [], 5)


def test_turn_metrics_keys() -> None:
    values = turn_metrics(RANKING, ["d7"], cutoffs=(1, 3))
    assert values == {
        "R@1": 0.0,
        "nDCG@1": 0.0,
        "hit@1": 0.0,
        "R@3": 1.0,
        "nDCG@3": pytest.approx(0.5),
        "hit@3": 1.0,
    }


def test_cluster_bootstrap_resamples_conversations() -> None:
    # Conversation a: two turns at 1.0; conversation b: one turn at 0.0.
    values, groups = [1.0, 1.0, 0.0], ["a", "a", "b"]
    low, high = bootstrap_ci(values, groups, samples=2000, seed=1)
    # Possible resampled means: all-a 1.0, all-b 0.0, mixed 2/3.
    assert low == 0.0 and high == 1.0
    constant = bootstrap_ci([0.5] * 4, ["a", "b", "c", "d"])
    assert constant == (0.5, 0.5)


def test_paired_bootstrap_of_differences() -> None:
    better = [1.0, 1.0, 1.0, 0.0]
    worse = [0.0, 1.0, 0.0, 0.0]
    result = paired_bootstrap(better, worse, ["a", "b", "c", "d"], samples=500)
    assert result["mean"] == pytest.approx(0.5)
    assert 0.0 <= result["low"] <= 0.5 <= result["high"] <= 1.0
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 0.0], ["a"])


def test_summarise_means_and_intervals() -> None:
    per_turn = [{"R@5": 1.0}, {"R@5": 0.0}]
    summary = summarise(per_turn, ["a", "b"], samples=200)
    assert summary["R@5"]["mean"] == 0.5
    assert summary["R@5"]["low"] <= 0.5 <= summary["R@5"]["high"]
