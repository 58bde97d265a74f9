"""The selection protocol: the score, ties by paired intervals, the simpler setting, LODO."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from benchmarks.experiments.selection import (
    Cell,
    choose,
    leave_one_domain_out,
    paired_score_interval,
    simplicity,
)
from tests.unit.evaluation.conftest import blend

SIMPLE = blend(history_turns=2, history_order="newest_first", history_roles="user")
RICH = blend(
    history_turns=4,
    history_order="newest_first",
    history_roles="separate",
    bm25_history_weight=0.3,
    assistant_weight=0.25,
)
WEAK = blend(alpha=0.8, history_turns=2, history_order="newest_first")
SHIPPED = blend(history_turns=2, history_order="newest_first", bm25_history_weight=0.3)
CONVERSATIONS = tuple(f"c{i // 2}" for i in range(40))


def cells(gains: dict[str, tuple[float, float]], noise: float) -> list[Cell]:
    """Two datasets, two history kinds; per label, a mean gain on each dataset."""
    rng = np.random.default_rng(1)
    result = []
    for position, dataset in enumerate(("a", "b")):
        for history in ("reference", "own"):
            values = {
                label: means[position] + noise * rng.standard_normal(len(CONVERSATIONS))
                for label, means in gains.items()
            }
            result.append(Cell(dataset, history, CONVERSATIONS, values))
    return result


def test_simplicity_counts_mechanisms_then_the_window() -> None:
    assert simplicity(SIMPLE) == (0, 0, 2)
    assert simplicity(RICH) == (0, 3, 4)
    assert simplicity(WEAK) == (0, 2, 2)


def test_a_clear_winner_is_chosen_and_the_runner_up_is_the_next_best() -> None:
    data = cells(
        {SIMPLE.label: (0.01, 0.01), RICH.label: (0.08, 0.06), WEAK.label: (0.0, 0.0)}, 0.01
    )
    decision = choose(data, [SIMPLE, RICH, WEAK], samples=500)
    assert decision["chosen"] == RICH and decision["runner_up"] == SIMPLE
    point, low, high = paired_score_interval(data, RICH.label, SIMPLE.label, samples=500)
    assert 0.0 < low <= point <= high


def test_within_noise_the_simpler_setting_wins() -> None:
    data = cells({SIMPLE.label: (0.05, 0.05), RICH.label: (0.055, 0.05)}, 0.2)
    decision = choose(data, [SIMPLE, RICH], samples=500)
    assert set(decision["ties"]) == {SIMPLE, RICH}
    assert decision["chosen"] == SIMPLE and decision["runner_up"] == RICH


def test_leave_one_domain_out_reports_the_share_kept() -> None:
    data = cells({SIMPLE.label: (0.04, 0.02), RICH.label: (0.1, -0.01)}, 0.0)
    rows = leave_one_domain_out(data, [SIMPLE, RICH], SIMPLE, RICH, samples=200)
    by = {(r["held_out"], r["row"]): r for r in rows}
    picked_on_a = by[("b", "chosen on the other dataset")]
    assert picked_on_a["label"] == RICH.label
    assert np.isclose(picked_on_a["gain_held_out"], -0.01)
    kept = by[("b", "chosen setting")]
    assert np.isclose(kept["gain_tuned_on"], 0.04) and np.isclose(kept["kept"], 0.5)
    assert by[("a", "runner-up")]["kept"] is None


def test_adaptive_mechanisms_rank_as_more_complex_than_any_fixed_setting() -> None:
    words = replace(SHIPPED, alpha_rule="content_words")
    evidence = replace(SIMPLE, answer_terms=5)
    assert simplicity(words) == (1, 2, 2) and simplicity(evidence) == (1, 0, 2)
    assert simplicity(RICH) < simplicity(evidence) < simplicity(words)
    data = cells({RICH.label: (0.05, 0.05), words.label: (0.055, 0.05)}, 0.2)
    assert choose(data, [RICH, words], samples=500)["chosen"] == RICH


def test_hedging_legs_count_as_fixed_mechanisms() -> None:
    shipped = SHIPPED
    hedged = replace(SHIPPED, query_leg_weight=0.5)
    questions = replace(SHIPPED.config, history_roles="user")
    answer = replace(SHIPPED, config=questions, answer_leg_weight=0.25)
    assert simplicity(shipped) == (0, 2, 2)
    assert simplicity(hedged) == (0, 3, 2) and simplicity(answer) == (0, 3, 2)
    data = cells({shipped.label: (0.05, 0.05), hedged.label: (0.055, 0.05)}, 0.2)
    assert choose(data, [hedged, shipped], samples=500)["chosen"] == shipped


def test_the_shipped_setting_gets_its_own_row_when_it_is_neither_pick() -> None:
    data = cells(
        {SIMPLE.label: (0.04, 0.02), RICH.label: (0.1, -0.01), WEAK.label: (0.03, 0.06)}, 0.0
    )
    rows = leave_one_domain_out(data, [SIMPLE, RICH, WEAK], SIMPLE, RICH, shipped=WEAK, samples=200)
    shipped = {r["held_out"]: r for r in rows if r["row"] == "shipped"}
    assert set(shipped) == {"a", "b"} and shipped["b"]["label"] == WEAK.label
    assert np.isclose(shipped["b"]["kept"], 2.0) and np.isclose(shipped["a"]["kept"], 0.5)
    again = leave_one_domain_out(data, [SIMPLE, RICH], SIMPLE, RICH, shipped=RICH, samples=200)
    assert not any(r["row"] == "shipped" for r in again)


def test_the_self_contained_check_counts_as_adaptive() -> None:
    checked = replace(SHIPPED, config=replace(SHIPPED.config, self_contained_similarity=0.4))
    assert simplicity(checked) == (1, 2, 2)
