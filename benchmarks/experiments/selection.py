"""How the shipped follow-up configuration is chosen: the protocol, fixed before the run.

Candidates are blend configurations (`QueryStrategy`), each ranked under the shipped
retrieval (hybrid, the configured fusion weights, `FUSION_CANDIDATES` per leg, no reranker)
on every cell: each development dataset (`DEV_DATASETS`: MTRAG ClapNQ and Govt; the
handbook lab is a smoke test and plays no part) with reference history and with own
history (`chatqna.evaluation.live`).

1. **Gain.** Per cell, a candidate's gain is its mean follow-up Recall@5 minus
   stateless's under the same retrieval, over the same turns.
2. **Score.** The mean of the gains over the cells (every dataset and history kind
   weighs the same, whatever its number of turns).
3. **Noise.** A candidate ties the best-scoring one when the paired 95% interval of
   `score(best) - score(candidate)` holds 0. The interval comes from a cluster bootstrap:
   each sample draws every dataset's conversations with replacement (the same draw serves
   both history kinds of that dataset) and recomputes the score difference.
4. **Simplicity.** Among the ties, the simplest wins (`simplicity`: fewer adaptive
   mechanisms, then fewer fixed ones, then the shorter history window, then the higher
   score). The **runner-up** is the
   best-scoring candidate other than the chosen one.
5. **Leave one domain out.** For each dataset, the same rule applied to the other
   dataset's cells alone picks a setting, which is then scored on the held-out dataset;
   the chosen setting and the runner-up are reported on both, with the share of their
   gain they keep on each dataset relative to the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chatqna.evaluation.strategies import QueryStrategy

DEV_DATASETS = ("mtrag-clapnq", "mtrag-govt")
HISTORY_KINDS = ("reference", "own")
SEED_ALPHA = 0.7


@dataclass(frozen=True)
class Cell:
    """Per-turn follow-up gains (candidate minus stateless R@5) of one dataset and history
    kind, with the conversation of each turn (the same turns, in the same order, for every
    candidate)."""

    dataset: str
    history: str
    conversations: tuple[str, ...]
    gains: Mapping[str, np.ndarray]


def simplicity(strategy: QueryStrategy) -> tuple[int, int, int]:
    """Lower is simpler: first the number of adaptive mechanisms (an alpha set per turn by
    a rule, the previous answer's terms in the BM25 leg, the self-contained check that
    turns the blend off per turn), which rank as more complex than
    any combination of the fixed ones; then the number of fixed mechanisms beyond the
    seed's blend of the user's questions at alpha 0.7 (reading assistant messages,
    embedding them as their own input, the history-aware BM25 leg, another alpha, a hedging
    dense leg of the follow-up's own vector, one of the previous answer's vector, which
    also reads assistant messages); then the history window."""
    config = strategy.config
    adaptive = sum(
        (
            strategy.alpha_rule != "fixed",
            strategy.answer_terms > 0,
            config.self_contained_similarity > 0,
        )
    )
    answer_leg = strategy.answer_leg_weight > 0.0
    mechanisms = sum(
        (
            config.history_roles != "user" or answer_leg,
            config.history_roles == "separate",
            config.bm25_history_weight > 0.0,
            strategy.alpha_rule == "fixed" and config.alpha != SEED_ALPHA,
            strategy.query_leg_weight > 0.0,
            answer_leg,
        )
    )
    return (adaptive, mechanisms, config.history_turns)


def score(cells: Sequence[Cell], label: str) -> float:
    return float(np.mean([cell.gains[label].mean() for cell in cells]))


def paired_score_interval(
    cells: Sequence[Cell],
    first: str,
    second: str,
    *,
    samples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """`score(first) - score(second)` with its 95% interval, resampling each dataset's
    conversations (one draw per dataset, shared by its history kinds)."""
    rng = np.random.default_rng(seed)
    by_dataset: dict[str, list[Cell]] = {}
    for cell in cells:
        by_dataset.setdefault(cell.dataset, []).append(cell)
    totals = np.zeros(samples)
    for members in by_dataset.values():
        names = sorted(set(members[0].conversations))
        draws = rng.integers(0, len(names), size=(samples, len(names)))
        counts = np.zeros((samples, len(names)))
        for row, picks in enumerate(draws):
            np.add.at(counts[row], picks, 1)
        for cell in members:
            diff = cell.gains[first] - cell.gains[second]
            position = {name: i for i, name in enumerate(names)}
            sums = np.zeros(len(names))
            sizes = np.zeros(len(names))
            for conversation, value in zip(cell.conversations, diff, strict=True):
                sums[position[conversation]] += value
                sizes[position[conversation]] += 1
            totals += (counts @ sums) / np.maximum(counts @ sizes, 1)
    totals /= len(cells)
    low, high = np.percentile(totals, [2.5, 97.5])
    point = score(cells, first) - score(cells, second)
    return point, float(low), float(high)


def choose(
    cells: Sequence[Cell], candidates: Sequence[QueryStrategy], *, samples: int = 2000
) -> dict[str, Any]:
    """The protocol's choice over `cells`: the chosen setting, the runner-up, the ties."""
    scores = {c.label: score(cells, c.label) for c in candidates}
    best = max(candidates, key=lambda c: scores[c.label])
    ties = []
    for candidate in candidates:
        _, low, high = paired_score_interval(cells, best.label, candidate.label, samples=samples)
        if low <= 0.0 <= high or candidate == best:
            ties.append(candidate)
    chosen = min(ties, key=lambda c: (simplicity(c), -scores[c.label]))
    runner_up = max((c for c in candidates if c != chosen), key=lambda c: scores[c.label])
    return {
        "chosen": chosen,
        "runner_up": runner_up,
        "best": best,
        "ties": ties,
        "scores": scores,
    }


def cell_gain(cells: Sequence[Cell], dataset: str, label: str) -> float:
    """A candidate's mean gain over `dataset`'s cells (its history kinds)."""
    return score([c for c in cells if c.dataset == dataset], label)


def leave_one_domain_out(
    cells: Sequence[Cell],
    candidates: Sequence[QueryStrategy],
    chosen: QueryStrategy,
    runner_up: QueryStrategy,
    *,
    shipped: QueryStrategy | None = None,
    samples: int = 2000,
) -> list[dict[str, Any]]:
    """Per held-out dataset: the setting the rule picks on the other dataset alone, and the
    chosen setting and the runner-up (and the `shipped` one, when it is another), each with
    its gain on the other dataset (where it would have been chosen) and on the held-out
    one, and the share kept."""
    rows = []
    names = sorted({c.dataset for c in cells})
    for held_out in names:
        others = [c for c in cells if c.dataset != held_out]
        picked = choose(others, candidates, samples=samples)["chosen"]
        roles = [
            ("chosen on the other dataset", picked),
            ("chosen setting", chosen),
            ("runner-up", runner_up),
        ]
        if shipped is not None and shipped not in (chosen, runner_up):
            roles.append(("shipped", shipped))
        for role, strategy in roles:
            tuned = float(
                np.mean([cell_gain(cells, d, strategy.label) for d in names if d != held_out])
            )
            held = cell_gain(cells, held_out, strategy.label)
            rows.append(
                {
                    "held_out": held_out,
                    "row": role,
                    "label": strategy.label,
                    "gain_tuned_on": tuned,
                    "gain_held_out": held,
                    "kept": held / tuned if tuned > 0 else None,
                }
            )
    return rows
