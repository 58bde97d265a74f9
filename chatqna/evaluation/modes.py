"""Benchmark modes: what the retriever searches with on each turn, built from product code.

| strategy        | dense leg                         | BM25 leg and reranker      |
|-----------------|-----------------------------------|----------------------------|
| `stateless`     | the latest message                | the latest message         |
| `append`        | earlier user questions + latest   | the same appended text     |
| `blend`         | `blend_query` (a, N) as served    | the latest message (BM25   |
|                 |                                   | hears earlier questions at |
|                 |                                   | the history weight; the    |
|                 |                                   | reranker the conversation) |
| `condense_llm`  | the condense LLM's rewrite        | the rewrite                |
| `condense_gold` | the dataset's `gold_rewrite`      | the gold rewrite           |

`stateless` and `blend` are planned by the service's own multi-turn strategy (with
`self_contained`, its check against the previous question), and each plan is the service's
`QueryPlan` (`BenchPlan.service`), which the harness searches and reranks with the
service's own steps (`chatqna.pipeline.sources`). Measured variants around it
(`chatqna.evaluation.follow_up_variants.candidates`): `alpha_rule="content_words"` plans each
follow-up with the alpha `content_word_alpha` gives it; `answer_terms=k` adds the previous
answer's `k` terms of highest IDF over the corpus to the BM25 history leg; two hedging
variants add a dense leg fused by the same RRF at a fixed share of the dense weight
(`chatqna.evaluation.follow_up_variants.hedge`): `query_leg_weight` the follow-up's own vector
beside the blend, `answer_leg_weight` the previous assistant message's (the blend then
holding the user's questions). Each strategy runs with hybrid retrieval on and off (at each
BM25 fusion weight and per-leg depth asked for) and with the reranker on and off.
`condense_llm` is planned by the service's own condense strategy with the history window,
timeout and length cap its `QueryStrategy` carries (`QueryStrategy.config`;
`condense_strategy` in `chatqna.evaluation.compare` takes them from `Settings`); a failed
rewrite is a failed turn (an empty ranking), as it is a 503 in the service.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chatqna.backends.protocols import ChatLLM, Embedder
from chatqna.errors import CondenseFailed
from chatqna.evaluation.dataset import EvalTurn
from chatqna.evaluation.follow_up_variants.candidates import (
    Idf,
    answer_terms,
    content_word_alpha,
    top_score_alpha,
)
from chatqna.evaluation.follow_up_variants.hedge import hedge_legs
from chatqna.evaluation.metrics import summarise
from chatqna.evaluation.strategies import QueryStrategy
from chatqna.multiturn.blend import earlier_questions
from chatqna.multiturn.history import Conversation
from chatqna.multiturn.rerank_query import KIND_MESSAGE, RerankQuery
from chatqna.multiturn.strategy import HistoryLeg, MultiTurnConfig, QueryPlan, build_strategy
from chatqna.retrieval.fusion import FUSION_CANDIDATES
from chatqna.retrieval.query import tokenize

ANSWER_TERMS_WEIGHT = 0.3  # the answer terms' BM25 weight when the questions' leg is off


@dataclass(frozen=True)
class Mode:
    """A query strategy with the retrieval switches it ran under.

    Hybrid search fuses each leg's best `max(depth, candidates)` passages with RRF weights
    (`dense_weight`, `bm25_weight`), as the indexes do (`rrf_candidates`).
    """

    query: QueryStrategy
    hybrid: bool
    rerank: bool
    bm25_weight: float = 1.0
    candidates: int = FUSION_CANDIDATES
    dense_weight: float = 1.0
    history: str = "reference"

    @property
    def fusion_weights(self) -> tuple[float, float]:
        return (self.dense_weight, self.bm25_weight)

    @property
    def retrieval_label(self) -> str:
        if not self.hybrid:
            return "dense"
        weights = "" if self.fusion_weights == (1.0, 1.0) else f" bm25={self.bm25_weight:g}"
        if self.dense_weight != 1.0:
            weights = f" dense={self.dense_weight:g}{weights}"
        return f"hybrid{weights} x{self.candidates}"

    @property
    def label(self) -> str:
        rerank = "rerank" if self.rerank else "no rerank"
        own = " [own history]" if self.history == "own" else ""
        return f"{self.query.label} ({self.retrieval_label}, {rerank}){own}"


def reads_answers(strategy: QueryStrategy) -> bool:
    """Whether the strategy's query depends on the assistant's earlier messages (only
    those rank differently with own history)."""
    if strategy.strategy == "blend":
        return (
            strategy.config.history_roles != "user"
            or strategy.answer_terms > 0
            or strategy.answer_leg_weight > 0
        )
    return strategy.strategy == "condense_llm"


@dataclass(frozen=True)
class BenchPlan:
    """One turn planned under one strategy: the multi-turn `QueryPlan` the retriever and the
    reranker receive (None when the turn failed: a failed rewrite), the hedging dense legs
    a measured variant adds (`chatqna.evaluation.follow_up_variants.hedge`), and what
    planning cost."""

    service: QueryPlan | None
    embedding_inputs: int
    llm_calls: int
    milliseconds: float
    failure: str | None = None
    dense_legs: tuple[tuple[np.ndarray, float], ...] = ()


def typed_plan(text: str, vector: np.ndarray) -> QueryPlan:
    """The plan of a turn that searches with a text of its own (`append`, the gold rewrite)
    as the service plans a stateless turn; with no rerank vector, a similarity reranker
    embeds `text` itself."""
    return QueryPlan("blend", "stateless", text, vector, RerankQuery(text, None, KIND_MESSAGE))


@dataclass(frozen=True)
class CorpusSignals:
    """What the adaptive candidates read from the indexed corpus: each term's IDF (for
    `answer_terms`) and the dense top-1 cosine of a text and its vector (for
    `alpha_rule="top_score"`)."""

    idf: Idf | None = None
    top_score: Callable[[str, np.ndarray], float] | None = None


async def turn_config(
    strategy: QueryStrategy, turn: EvalTurn, embedder: Embedder, signals: CorpusSignals | None
) -> MultiTurnConfig:
    """The strategy's configuration with this follow-up's alpha (`content_word_alpha` for
    "content_words", `top_score_alpha` for "top_score"); a first turn never blends and keeps
    its alpha."""
    config = strategy.config
    if strategy.alpha_rule == "fixed" or not turn.history:
        return config
    if strategy.alpha_rule == "content_words":
        return replace(config, alpha=content_word_alpha(len(set(tokenize(turn.query)))))
    if strategy.alpha_rule != "top_score":
        raise ValueError(f"unknown alpha rule {strategy.alpha_rule!r}")
    if signals is None or signals.top_score is None:
        raise ValueError("alpha_rule top_score needs the corpus's dense top-1 score")
    vector = (await embedder.embed([turn.query]))[0]
    top = signals.top_score(turn.query, vector)
    return replace(config, alpha=top_score_alpha(top, config.alpha))


def answer_leg(
    strategy: QueryStrategy,
    conversation: Conversation,
    planned: QueryPlan,
    signals: CorpusSignals | None,
) -> QueryPlan:
    """`planned` with the previous answer's `answer_terms` rarest terms in its BM25 history
    leg, beside the earlier questions, or alone at `ANSWER_TERMS_WEIGHT`; only on a blended
    follow-up."""
    leg = planned.history_leg
    history = leg.questions if leg is not None else ""
    weight = leg.search_weight if leg is not None else 0.0
    executed = planned.blend is not None and planned.blend.executed
    if strategy.answer_terms <= 0 or not executed:
        return planned
    if signals is None or signals.idf is None:
        raise ValueError("answer terms need the corpus's IDF")
    asked = earlier_questions(conversation) if weight > 0.0 else ()
    terms = answer_terms(conversation, tokenize, signals.idf, asked, strategy.answer_terms)
    if not terms:
        return planned
    if weight > 0.0:
        heard = HistoryLeg(True, weight, f"{history}\n{' '.join(terms)}")
    else:
        heard = HistoryLeg(True, ANSWER_TERMS_WEIGHT, " ".join(terms))
    return replace(planned, history_leg=heard)


async def service_plan(
    turn: EvalTurn,
    strategy: QueryStrategy,
    embedder: Embedder,
    signals: CorpusSignals | None,
    started: float,
) -> BenchPlan:
    """The service's own planning, exactly as served under these settings, with the BM25
    history leg of `answer_leg` and the hedging dense legs of `hedge_legs`."""
    conversation = turn.conversation()
    config = await turn_config(strategy, turn, embedder, signals)
    planned = await build_strategy(config, embedder=embedder).plan(conversation)
    planned = answer_leg(strategy, conversation, planned, signals)
    weights = (strategy.query_leg_weight, strategy.answer_leg_weight)
    legs = await hedge_legs(weights, conversation, planned, embedder)
    executed = planned.blend is not None and planned.blend.executed
    answered = len(legs) - int(strategy.query_leg_weight > 0.0 and executed)
    # The self-contained check embeds the previous question in the same call, blended or not.
    checked = planned.blend is not None and planned.blend.question_similarity is not None
    return BenchPlan(
        planned,
        3 + answered if checked else 2 + answered if executed else 1,
        0,
        (time.perf_counter() - started) * 1000,
        dense_legs=legs,
    )


async def plan_turn(
    turn: EvalTurn,
    strategy: QueryStrategy,
    embedder: Embedder,
    llm: ChatLLM | None,
    *,
    signals: CorpusSignals | None = None,
) -> BenchPlan:
    """Form the search inputs of `turn` with the product's own multi-turn code (`signals`:
    what the adaptive candidates read from the corpus)."""
    started = time.perf_counter()
    conversation = turn.conversation()

    def done(
        planned: QueryPlan | None, inputs: int, calls: int = 0, failure: str | None = None
    ) -> BenchPlan:
        return BenchPlan(planned, inputs, calls, (time.perf_counter() - started) * 1000, failure)

    if strategy.strategy in ("stateless", "blend"):
        return await service_plan(turn, strategy, embedder, signals, started)
    if strategy.strategy == "append":
        earlier = [m.content for m in turn.history if m.role == "user"]
        text = " ".join([*earlier, turn.query])
        return done(typed_plan(text, (await embedder.embed([text]))[0]), 1)
    if strategy.strategy == "condense_gold":
        text = turn.gold_rewrite or turn.query
        return done(typed_plan(text, (await embedder.embed([text]))[0]), 1)
    if strategy.strategy == "condense_llm":
        if llm is None:
            raise ValueError("condense_llm needs an LLM")
        condense = build_strategy(strategy.config, embedder=embedder, condense_llm=llm)
        try:
            planned = await condense.plan(conversation)
        except CondenseFailed as exc:
            return done(None, 0, 1, failure=exc.reason)
        calls = 1 if planned.condense is not None and planned.condense.rewritten else 0
        return done(planned, 1, calls)
    raise ValueError(f"unknown strategy {strategy.strategy!r}")


def turn_groups(turns: Sequence[EvalTurn], *, per_turn: bool = False) -> dict[str, list[EvalTurn]]:
    """Scored turns by group: `turn_1`, `follow_ups`, and with `per_turn` each `turn_N`."""
    groups: dict[str, list[EvalTurn]] = {
        "turn_1": [t for t in turns if t.turn == 1],
        "follow_ups": [t for t in turns if t.is_follow_up],
    }
    if per_turn:
        for number in sorted({t.turn for t in turns if t.is_follow_up}):
            groups[f"turn_{number}"] = [t for t in turns if t.turn == number]
    return groups


@dataclass
class ModeResult:
    """Per-turn rankings and metrics of one mode, with its summaries and costs."""

    mode: Mode
    rankings: dict[str, list[str]] = field(default_factory=dict)
    per_turn: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def split(self, turns: Sequence[EvalTurn], samples: int) -> dict[str, Any]:
        groups = turn_groups(turns, per_turn=True)
        return {
            name: {
                "turns": len(members),
                "metrics": summarise(
                    [self.per_turn[t.key] for t in members],
                    [t.conversation_id for t in members],
                    samples=samples,
                ),
            }
            for name, members in groups.items()
            if members
        }
