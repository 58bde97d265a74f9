"""Retrieval metrics over ranked id lists, and bootstrap intervals that resample conversations.

With `R` the relevant ids of a turn and `ranking` the retrieved ids, best first:

- Recall@k = |R ∩ top-k| / |R|
- hit@k    = 1 if R ∩ top-k is not empty, else 0
- nDCG@k   = DCG@k / IDCG@k with binary gains, DCG@k = sum over relevant ids at 1-based
             rank r <= k of 1 / log2(r + 1), and IDCG@k the DCG of a perfect ranking,
             sum_{r=1}^{min(|R|, k)} 1 / log2(r + 1) (Järvelin and Kekäläinen, 2002).

Relevant ids missing from the corpus stay in `R`: they can never be retrieved, so they
lower recall, which is honest about the labels. A turn with no relevant ids is not scored.
Rankings are total orders (retrievers break score ties by a stable order), so ties never
make a metric ambiguous.

Confidence intervals use the cluster bootstrap: conversations are resampled with
replacement (turns of one conversation are not independent) and the mean over the turns
of the resampled conversations is recomputed; the interval is the 2.5th-97.5th percentile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

CUTOFFS = (1, 3, 5, 10)


def recall_at_k(ranking: Sequence[str], relevant: Sequence[str], k: int) -> float:
    wanted = set(relevant)
    if not wanted:
        raise ValueError("a turn with no relevant ids cannot be scored")
    return len(wanted.intersection(ranking[:k])) / len(wanted)


def hit_at_k(ranking: Sequence[str], relevant: Sequence[str], k: int) -> float:
    return 1.0 if set(relevant).intersection(ranking[:k]) else 0.0


def ndcg_at_k(ranking: Sequence[str], relevant: Sequence[str], k: int) -> float:
    wanted = set(relevant)
    if not wanted:
        raise ValueError("a turn with no relevant ids cannot be scored")
    dcg = sum(
        1.0 / math.log2(rank + 1)
        for rank, item in enumerate(ranking[:k], start=1)
        if item in wanted
    )
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(wanted), k) + 1))
    return dcg / ideal


def turn_metrics(
    ranking: Sequence[str], relevant: Sequence[str], cutoffs: Sequence[int] = CUTOFFS
) -> dict[str, float]:
    """All metrics of one turn, keyed like `R@5`, `nDCG@5`, `hit@5`."""
    values: dict[str, float] = {}
    for k in cutoffs:
        values[f"R@{k}"] = recall_at_k(ranking, relevant, k)
        values[f"nDCG@{k}"] = ndcg_at_k(ranking, relevant, k)
        values[f"hit@{k}"] = hit_at_k(ranking, relevant, k)
    return values


def _clusters(groups: Sequence[str]) -> list[np.ndarray]:
    index: dict[str, list[int]] = {}
    for position, group in enumerate(groups):
        index.setdefault(group, []).append(position)
    return [np.asarray(rows) for rows in index.values()]


def bootstrap_ci(
    values: Sequence[float], groups: Sequence[str], *, samples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """95% cluster-bootstrap interval of the mean of `values`, resampling `groups`."""
    data = np.asarray(values, dtype=np.float64)
    clusters = _clusters(groups)
    if len(data) == 0:
        return (math.nan, math.nan)
    sums = np.asarray([data[rows].sum() for rows in clusters])
    counts = np.asarray([len(rows) for rows in clusters])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(clusters), size=(samples, len(clusters)))
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    groups: Sequence[str],
    *,
    samples: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """Mean of `a - b` per turn with its 95% cluster-bootstrap interval (same turns, paired)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    low, high = bootstrap_ci(diff.tolist(), groups, samples=samples, seed=seed)
    return {"mean": float(diff.mean()) if len(diff) else math.nan, "low": low, "high": high}


def summarise(
    per_turn: Sequence[Mapping[str, float]],
    groups: Sequence[str],
    *,
    samples: int = 1000,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Mean and interval of every metric over a set of turns."""
    if not per_turn:
        return {}
    summary = {}
    for name in per_turn[0]:
        values = [turn[name] for turn in per_turn]
        low, high = bootstrap_ci(values, groups, samples=samples, seed=seed)
        summary[name] = {"mean": float(np.mean(values)), "low": low, "high": high}
    return summary
