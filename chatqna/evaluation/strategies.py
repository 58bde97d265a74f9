"""Query strategies: how a benchmark row forms each turn's query, and the grid of them.

A `QueryStrategy` names a strategy (`chatqna.evaluation.modes` plans it) and the values it
plans with. It maps to the service's multi-turn configuration both ways:
`QueryStrategy.from_config(config)` is the strategy the service plans a turn with under
`config`, and `config()` gives that configuration back. The rows that measure the served
configuration (`chatqna.evaluation.compare`) are thus read from `Settings` by
`MultiTurnConfig.from_settings`, as the service's own strategy is. `default_strategies` is
the grid a `chatqna bench` run measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatqna.multiturn.strategy import MultiTurnConfig


@dataclass(frozen=True)
class QueryStrategy:
    """How a turn's query is formed (independent of the retrieval switches)."""

    strategy: str
    alpha: float = 0.7
    history_turns: int = 6
    order: str = "chronological"
    roles: str = "user_assistant"
    bm25_history_weight: float = 0.0
    rerank_query: str = "conversation"
    assistant_weight: float = 0.5
    alpha_rule: str = "fixed"
    answer_terms: int = 0
    query_leg_weight: float = 0.0
    answer_leg_weight: float = 0.0
    self_contained: float = 0.0
    condense_timeout: float = 10.0
    condense_max_chars: int = 500

    @property
    def label(self) -> str:
        if self.strategy == "blend":
            extra = " newest-first" if self.order == "newest_first" else ""
            extra += " user-only" if self.roles == "user" else ""
            if self.roles == "separate":
                extra += f" separate-roles assistant={self.assistant_weight:g}"
            if self.bm25_history_weight:
                extra += f" bm25-history={self.bm25_history_weight:g}"
            if self.alpha_rule != "fixed":
                extra += f" alpha-rule={self.alpha_rule}"
            if self.answer_terms:
                extra += f" answer-terms={self.answer_terms}"
            if self.query_leg_weight:
                extra += f" query-leg={self.query_leg_weight:g}"
            if self.answer_leg_weight:
                extra += f" answer-leg={self.answer_leg_weight:g}"
            if self.self_contained:
                extra += f" self-contained={self.self_contained:g}"
            if self.rerank_query != "conversation":
                extra += f" rerank-query={self.rerank_query}"
            return f"blend a={self.alpha:.2f} n={self.history_turns}{extra}"
        if self.strategy == "condense_llm":
            return f"condense (LLM, n={self.history_turns})"
        if self.strategy == "condense_gold":
            return "condense (gold rewrite)"
        return self.strategy

    @classmethod
    def from_config(cls, config: MultiTurnConfig) -> QueryStrategy:
        """The strategy the service plans a turn with under `config` (`config()` gives it
        back): `condense_llm` in condense mode, else `blend` with the blend switched on,
        `stateless` with it off. In condense mode the blend switch is not read (condense
        wins), and comes back off."""
        if config.mode == "condense":
            strategy = "condense_llm"
        else:
            strategy = "blend" if config.blend_enabled else "stateless"
        return cls(
            strategy,
            alpha=config.alpha,
            history_turns=config.history_turns,
            order=config.history_order,
            roles=config.history_roles,
            bm25_history_weight=config.bm25_history_weight,
            rerank_query=config.rerank_query,
            assistant_weight=config.assistant_weight,
            self_contained=config.self_contained_similarity,
            condense_timeout=config.condense_timeout_seconds,
            condense_max_chars=config.condense_max_query_chars,
        )

    def own_values(self) -> QueryStrategy:
        """This strategy with only the values its planning reads (`PLANNED_WITH`), the
        others at their defaults: two strategies that plan alike are then equal, and the
        harness plans them once."""
        read = PLANNED_WITH.get(self.strategy, ())
        return QueryStrategy(self.strategy, **{name: getattr(self, name) for name in read})

    def config(self) -> MultiTurnConfig:
        """The multi-turn configuration under which the service plans a turn as this
        strategy does (condense for `condense_llm`, else the blend, switched on only for
        `blend`)."""
        return MultiTurnConfig(
            mode="condense" if self.strategy == "condense_llm" else "blend",
            blend_enabled=self.strategy == "blend",
            alpha=self.alpha,
            history_turns=self.history_turns,
            history_order=self.order,
            history_roles=self.roles,
            assistant_weight=self.assistant_weight,
            bm25_history_weight=self.bm25_history_weight,
            self_contained_similarity=self.self_contained,
            rerank_query=self.rerank_query,
            condense_timeout_seconds=self.condense_timeout,
            condense_max_query_chars=self.condense_max_chars,
        )


# The values each strategy's planning reads, beyond its name.
PLANNED_WITH: dict[str, tuple[str, ...]] = {
    "blend": (
        "alpha",
        "history_turns",
        "order",
        "roles",
        "bm25_history_weight",
        "rerank_query",
        "assistant_weight",
        "alpha_rule",
        "answer_terms",
        "query_leg_weight",
        "answer_leg_weight",
        "self_contained",
    ),
    "condense_llm": ("history_turns", "condense_timeout", "condense_max_chars"),
}


def default_strategies(
    *,
    alphas: tuple[float, ...],
    history_turns: tuple[int, ...],
    condense: QueryStrategy | None = None,
    orders: tuple[str, ...] = ("chronological",),
    bm25_history_weights: tuple[float, ...] = (0.0,),
    roles: tuple[str, ...] = ("user_assistant",),
    assistant_weights: tuple[float, ...] = (0.5,),
    self_contained: tuple[float, ...] = (0.0,),
    rerank_query: str = "conversation",
) -> list[QueryStrategy]:
    """Stateless, append, every blend of the grid (each reranking against `rerank_query`),
    `condense` (the condense row of a run with an LLM) and the gold rewrite."""
    strategies = [QueryStrategy("stateless"), QueryStrategy("append")]
    strategies += [
        QueryStrategy("blend", a, n, order, role, w, rerank_query, share, self_contained=gate)
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
