"""Query strategies: how a benchmark row forms each turn's query, and the grid of them.

A `QueryStrategy` names a strategy (`chatqna.evaluation.modes` plans it) and holds the
service's own multi-turn configuration it plans with (`MultiTurnConfig`), beside the few
knobs only the benchmark has: the candidates measured around the shipped blend
(`chatqna.evaluation.follow_up_variants`). The strategy's name sets the configuration's
`mode` and `blend_enabled`, so `config` is exactly what the service builds its strategy
from. The rows that measure the served configuration (`chatqna.evaluation.compare`) hold
`MultiTurnConfig.from_settings`, as the service does. `default_strategies` is the grid a
`chatqna bench` run measures, every blend of it a variation of the served configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chatqna.multiturn.strategy import MultiTurnConfig

# What a strategy plans with when it is given no configuration: the blend of the design
# documents (alpha 0.7 over six messages of both sides, oldest first, plain BM25, no
# self-contained check). The rows built on it name every value they change.
SEED = MultiTurnConfig(
    mode="blend",
    blend_enabled=False,
    alpha=0.7,
    history_turns=6,
    history_order="chronological",
    history_roles="user_assistant",
    assistant_weight=0.5,
    bm25_history_weight=0.0,
    self_contained_similarity=0.0,
    rerank_query="conversation",
    condense_timeout_seconds=10.0,
    condense_max_query_chars=500,
)


@dataclass(frozen=True)
class QueryStrategy:
    """How a turn's query is formed (independent of the retrieval switches).

    `strategy` is `stateless`, `blend` or `condense_llm` (planned by the service's own
    strategy under `config`), `append` or `condense_gold` (the benchmark's own texts). The
    other fields are the measured candidates, which no setting reaches: `alpha_rule` (an
    alpha set per follow-up), `answer_terms` (the previous answer's rarest terms in the BM25
    history leg) and the hedging dense legs' shares (`query_leg_weight`, `answer_leg_weight`).
    """

    strategy: str
    config: MultiTurnConfig = SEED
    alpha_rule: str = "fixed"
    answer_terms: int = 0
    query_leg_weight: float = 0.0
    answer_leg_weight: float = 0.0

    def __post_init__(self) -> None:
        # The service picks its strategy by these two values: the name decides them, so that
        # two strategies that plan alike are equal (and a run plans them once).
        planned = replace(
            self.config,
            mode="condense" if self.strategy == "condense_llm" else "blend",
            blend_enabled=self.strategy == "blend",
        )
        object.__setattr__(self, "config", planned)

    @property
    def label(self) -> str:
        config = self.config
        if self.strategy == "blend":
            extra = " newest-first" if config.history_order == "newest_first" else ""
            extra += " user-only" if config.history_roles == "user" else ""
            if config.history_roles == "separate":
                extra += f" separate-roles assistant={config.assistant_weight:g}"
            if config.bm25_history_weight:
                extra += f" bm25-history={config.bm25_history_weight:g}"
            if self.alpha_rule != "fixed":
                extra += f" alpha-rule={self.alpha_rule}"
            if self.answer_terms:
                extra += f" answer-terms={self.answer_terms}"
            if self.query_leg_weight:
                extra += f" query-leg={self.query_leg_weight:g}"
            if self.answer_leg_weight:
                extra += f" answer-leg={self.answer_leg_weight:g}"
            if config.self_contained_similarity:
                extra += f" self-contained={config.self_contained_similarity:g}"
            if config.rerank_query != "conversation":
                extra += f" rerank-query={config.rerank_query}"
            return f"blend a={config.alpha:.2f} n={config.history_turns}{extra}"
        if self.strategy == "condense_llm":
            return f"condense (LLM, n={config.history_turns})"
        if self.strategy == "condense_gold":
            return "condense (gold rewrite)"
        return self.strategy


def default_strategies(
    served: MultiTurnConfig,
    *,
    alphas: tuple[float, ...],
    history_turns: tuple[int, ...],
    condense: QueryStrategy | None = None,
    orders: tuple[str, ...] = ("chronological",),
    bm25_history_weights: tuple[float, ...] = (0.0,),
    roles: tuple[str, ...] = ("user_assistant",),
    assistant_weights: tuple[float, ...] = (0.5,),
    self_contained: tuple[float, ...] = (0.0,),
) -> list[QueryStrategy]:
    """Stateless, append, every blend of the grid (`served` with the grid's values, so each
    reranks against its `rerank_query`), `condense` (the condense row of a run with an LLM)
    and the gold rewrite."""
    strategies = [QueryStrategy("stateless"), QueryStrategy("append")]
    strategies += [
        QueryStrategy(
            "blend",
            replace(
                served,
                alpha=a,
                history_turns=n,
                history_order=order,
                history_roles=role,
                assistant_weight=share,
                bm25_history_weight=w,
                self_contained_similarity=gate,
            ),
        )
        for gate in self_contained
        for w in bm25_history_weights
        for role in roles
        for share in (assistant_weights if role == "separate" else (0.5,))
        for order in orders
        for n in history_turns
        for a in alphas
    ]
    if condense is not None:
        strategies.append(condense)
    strategies.append(QueryStrategy("condense_gold"))
    return strategies
