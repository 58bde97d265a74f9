"""Query strategies: the service's multi-turn configuration a strategy plans with, its name
deciding the mode, and the grid of a run."""

from __future__ import annotations

from dataclasses import replace

from chatqna.evaluation.strategies import SEED, QueryStrategy, default_strategies
from chatqna.multiturn.strategy import MultiTurnConfig
from chatqna.settings import Settings


def served_with(**values: object) -> MultiTurnConfig:
    """The served configuration (the settings' defaults) with these `values`."""
    return replace(MultiTurnConfig.from_settings(Settings()), **values)  # type: ignore[arg-type]


def test_the_name_sets_the_mode_and_the_blend_switch_the_service_reads() -> None:
    served = served_with(mode="condense", blend_enabled=True, alpha=0.4, history_turns=5)
    condense = QueryStrategy("condense_llm", served).config
    blend = QueryStrategy("blend", served).config
    stateless = QueryStrategy("stateless", served).config
    assert (condense.mode, condense.blend_enabled) == ("condense", False)
    assert (blend.mode, blend.blend_enabled) == ("blend", True)
    assert (stateless.mode, stateless.blend_enabled) == ("blend", False)
    # Every other value is the one given.
    assert replace(blend, mode="condense", blend_enabled=True) == served
    assert QueryStrategy("append").config == SEED


def test_strategies_that_plan_alike_are_equal() -> None:
    switched_on = replace(SEED, blend_enabled=True)
    assert QueryStrategy("blend", switched_on) == QueryStrategy("blend", SEED)
    assert QueryStrategy("blend", SEED) != QueryStrategy("blend", replace(SEED, alpha=0.6))
    again = replace(QueryStrategy("blend", SEED), strategy="condense_llm")
    assert again.config.mode == "condense" and not again.config.blend_enabled


def test_labels_name_every_value_that_differs_from_the_plain_blend() -> None:
    assert QueryStrategy("blend").label == "blend a=0.70 n=6"
    served = served_with(history_roles="separate", assistant_weight=0.25)
    assert QueryStrategy("blend", served, answer_terms=5).label == (
        "blend a=0.70 n=2 newest-first separate-roles assistant=0.25 bm25-history=0.3 "
        "answer-terms=5 self-contained=0.4"
    )
    assert QueryStrategy("condense_llm", served).label == "condense (LLM, n=2)"
    assert QueryStrategy("condense_gold", served).label == "condense (gold rewrite)"


def test_the_grid_varies_the_served_configuration() -> None:
    served = served_with(rerank_query="message", condense_timeout_seconds=30.0)
    grid = default_strategies(
        served,
        alphas=(0.6, 0.8),
        history_turns=(2,),
        roles=("user", "separate"),
        assistant_weights=(0.25,),
    )
    names = [s.strategy for s in grid]
    assert names == ["stateless", "append", *["blend"] * 4, "condense_gold"]
    blends = [s.config for s in grid if s.strategy == "blend"]
    assert [(c.alpha, c.history_roles, c.assistant_weight) for c in blends] == [
        (0.6, "user", 0.5),
        (0.8, "user", 0.5),
        (0.6, "separate", 0.25),
        (0.8, "separate", 0.25),
    ]
    assert {(c.rerank_query, c.condense_timeout_seconds, c.history_order) for c in blends} == {
        ("message", 30.0, "chronological")
    }
    assert all(c.bm25_history_weight == 0.0 and c.blend_enabled for c in blends)
