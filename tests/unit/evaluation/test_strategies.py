"""Query strategies: the service's multi-turn configuration both ways, and the values a
strategy plans with."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import example, given
from hypothesis import strategies as st

from chatqna.evaluation.strategies import QueryStrategy
from chatqna.multiturn.strategy import MultiTurnConfig

SHARES = st.floats(0.0, 1.0, allow_nan=False)
CONFIGS = st.builds(
    MultiTurnConfig,
    mode=st.sampled_from(["blend", "condense"]),
    blend_enabled=st.booleans(),
    alpha=SHARES,
    history_turns=st.integers(0, 12),
    history_order=st.sampled_from(["chronological", "newest_first"]),
    history_roles=st.sampled_from(["user_assistant", "user", "separate"]),
    assistant_weight=SHARES,
    bm25_history_weight=SHARES,
    self_contained_similarity=SHARES,
    rerank_query=st.sampled_from(["conversation", "message"]),
    condense_timeout_seconds=st.floats(0.01, 60.0),
    condense_max_query_chars=st.integers(20, 2000),
).filter(lambda c: not (c.mode == "condense" and c.blend_enabled))


@given(CONFIGS)
@example(MultiTurnConfig(mode="condense", history_turns=5, condense_timeout_seconds=2.5))
@example(
    MultiTurnConfig(
        blend_enabled=True,
        alpha=0.3,
        history_turns=6,
        history_order="chronological",
        history_roles="separate",
        assistant_weight=0.2,
        bm25_history_weight=0.0,
        self_contained_similarity=0.0,
        rerank_query="message",
        condense_max_query_chars=90,
    )
)
def test_a_config_comes_back_from_its_strategy(config: MultiTurnConfig) -> None:
    assert QueryStrategy.from_config(config).config() == config


def test_the_strategy_of_a_config_is_the_one_the_service_plans_with() -> None:
    condense = MultiTurnConfig(mode="condense", history_turns=5, condense_max_query_chars=90)
    blend = MultiTurnConfig(blend_enabled=True, alpha=0.4, history_order="chronological")
    assert QueryStrategy.from_config(condense).strategy == "condense_llm"
    assert QueryStrategy.from_config(blend).strategy == "blend"
    assert QueryStrategy.from_config(MultiTurnConfig()).strategy == "stateless"
    # Condense wins over the blend switch, which comes back off.
    both = replace(condense, blend_enabled=True)
    assert QueryStrategy.from_config(both).config() == condense


def test_a_strategy_keeps_only_the_values_its_planning_reads() -> None:
    served = MultiTurnConfig(blend_enabled=True, alpha=0.4, condense_timeout_seconds=30.0)
    blend = QueryStrategy.from_config(served)
    condense = QueryStrategy.from_config(MultiTurnConfig(mode="condense", history_turns=5))
    assert blend.own_values() == replace(blend, condense_timeout=10.0)
    assert blend.own_values().alpha == 0.4
    assert condense.own_values() == QueryStrategy(
        "condense_llm", history_turns=5, condense_timeout=10.0, condense_max_chars=500
    )
    assert QueryStrategy("stateless", alpha=0.2).own_values() == QueryStrategy("stateless")
