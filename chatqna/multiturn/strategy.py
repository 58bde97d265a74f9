"""The multi-turn strategy: how a turn's conversation becomes what the retriever searches with.

One strategy is chosen once, from the `MULTI_TURN_*` and `CONDENSE_*` settings
(`MultiTurnConfig`), by `build_strategy`; the pipeline calls its `plan` once per turn and
gets a `QueryPlan`:

- `BlendStrategy` (`MULTI_TURN_MODE=blend`): the dense leg searches with the blended
  vector, or the query's own vector when the blend does not run (stateless: the blend flag
  is off, a first turn, or a follow-up as alike to the previous question as
  `MULTI_TURN_SELF_CONTAINED_SIMILARITY` says). BM25 gets the isolated query text; on a
  blended follow-up BM25 also hears the earlier questions at
  `MULTI_TURN_BM25_HISTORY_WEIGHT` (where the retriever supports it) and the reranker
  scores against the conversation (`MULTI_TURN_RERANK_QUERY`, see
  `chatqna.multiturn.rerank_query`).
- `CondenseStrategy` (`MULTI_TURN_MODE=condense`): the LLM's standalone rewrite (or, with
  no history, the raw message) drives the dense leg, BM25 and the reranker; a failed
  rewrite raises `CondenseFailed`.

A strategy runs its steps through `PlanSteps`, which the pipeline implements to put each
step in its span: the rewrite before the turn's own span, the embedding inside it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import numpy as np

from chatqna.backends.protocols import ChatLLM, Embedder
from chatqna.multiturn.blend import BlendResult, blend_query, earlier_questions
from chatqna.multiturn.condense import CondenseOutcome, condense_follow_up
from chatqna.multiturn.history import Conversation
from chatqna.multiturn.rerank_query import (
    KIND_CONVERSATION,
    KIND_MESSAGE,
    KIND_STANDALONE,
    RerankQuery,
    conversation_text,
)
from chatqna.multiturn.translate import HistoryTranslator

if TYPE_CHECKING:
    from chatqna.settings import Settings

T = TypeVar("T")
Strategy = Literal["stateless", "blend", "condense"]
Mode = Literal["blend", "condense"]


@dataclass(frozen=True)
class HistoryLeg:
    """The history-aware BM25 leg: whether it runs, its configured weight, what it hears."""

    ran: bool
    weight: float
    questions: str = ""

    @property
    def search_weight(self) -> float:
        return self.weight if self.ran else 0.0


@dataclass(frozen=True)
class QueryPlan:
    """What the retriever and the reranker receive for one turn, and how it was made.

    `embedding` drives the dense leg and `text` the BM25 leg; `rerank` is what the reranker
    scores against. Exactly one of `condense` and `blend` is set; `history_leg` is set on
    the turns that fuse a BM25 leg with the dense one as the blend mode plans them.
    """

    mode: Mode
    strategy: Strategy
    text: str
    embedding: np.ndarray
    rerank: RerankQuery
    condense: CondenseOutcome | None = None
    blend: BlendResult | None = None
    history_leg: HistoryLeg | None = None


class PlanSteps(Protocol):
    """Where a strategy's steps run: the pipeline traces and times each one."""

    async def rewrite(self, work: Awaitable[CondenseOutcome]) -> CondenseOutcome: ...

    async def embed(self, work: Awaitable[T]) -> T: ...


class Untraced:
    """`PlanSteps` that only run the steps (planning outside a served turn: benchmarks)."""

    async def rewrite(self, work: Awaitable[CondenseOutcome]) -> CondenseOutcome:
        return await work

    async def embed(self, work: Awaitable[T]) -> T:
        return await work


UNTRACED = Untraced()


class MultiTurnStrategy(Protocol):
    """How a turn's retrieval query is made from its conversation."""

    @property
    def mode(self) -> Mode:
        """The `MULTI_TURN_MODE` this strategy serves."""
        ...

    async def plan(self, conversation: Conversation, steps: PlanSteps = UNTRACED) -> QueryPlan:
        """The turn's `QueryPlan`; raises `CondenseFailed` when a rewrite fails."""
        ...


@dataclass(frozen=True)
class MultiTurnConfig:
    """The settings group a strategy is built from (read once from `Settings`).

    No field has a default: `Settings` is the one place that holds the multi-turn defaults,
    so a configuration comes from `from_settings`, or names every value (the benchmark's
    seed, `chatqna.evaluation.strategies.SEED`).
    """

    mode: Mode
    blend_enabled: bool
    alpha: float
    history_turns: int
    history_order: str
    history_roles: str
    assistant_weight: float
    bm25_history_weight: float
    self_contained_similarity: float
    rerank_query: str
    condense_timeout_seconds: float
    condense_max_query_chars: int

    @classmethod
    def from_settings(cls, settings: Settings) -> MultiTurnConfig:
        return cls(
            mode=settings.multi_turn_mode,
            blend_enabled=settings.blend_active,
            alpha=settings.multi_turn_blend_alpha,
            history_turns=settings.multi_turn_history_turns,
            history_order=settings.multi_turn_history_order,
            history_roles=settings.multi_turn_history_roles,
            assistant_weight=settings.multi_turn_assistant_weight,
            bm25_history_weight=settings.multi_turn_bm25_history_weight,
            self_contained_similarity=settings.multi_turn_self_contained_similarity,
            rerank_query=settings.multi_turn_rerank_query,
            condense_timeout_seconds=settings.condense_timeout_seconds,
            condense_max_query_chars=settings.condense_max_query_chars,
        )


@dataclass(frozen=True)
class BlendStrategy:
    """`MULTI_TURN_MODE=blend`; with the blend off (or on a first turn) a stateless turn."""

    config: MultiTurnConfig
    embedder: Embedder
    translator: HistoryTranslator | None = None
    bm25_history_supported: bool = True
    mode: Mode = "blend"

    async def plan(self, conversation: Conversation, steps: PlanSteps = UNTRACED) -> QueryPlan:
        config = self.config
        blend = await steps.embed(
            blend_query(
                conversation,
                self.embedder,
                enabled=config.blend_enabled,
                alpha=config.alpha,
                history_turns=config.history_turns,
                translator=self.translator,
                order=config.history_order,
                roles=config.history_roles,
                assistant_weight=config.assistant_weight,
                self_contained=config.self_contained_similarity,
            )
        )
        # The history-aware BM25 leg and the conversation's rerank query run only when the
        # blend ran, so a first turn keeps exactly the stateless ranking. The OPEA retriever
        # API has no field for earlier questions: such a retriever keeps BM25 plain.
        # Where the history was translated, they hear it as the embedding did, in English.
        asked = (
            tuple(blend.in_english(q) for q in earlier_questions(conversation))
            if blend.executed
            else ()
        )
        weight = config.bm25_history_weight
        ran = bool(asked) and weight > 0.0 and self.bm25_history_supported
        if blend.executed and config.rerank_query == KIND_CONVERSATION:
            text = conversation_text(conversation.query, asked)
            rerank = RerankQuery(text, blend.embedding, KIND_CONVERSATION)
        else:
            rerank = RerankQuery(conversation.query, blend.query_embedding, KIND_MESSAGE)
        return QueryPlan(
            mode=self.mode,
            strategy="blend" if blend.executed else "stateless",
            text=conversation.query,
            embedding=blend.embedding,
            rerank=rerank,
            blend=blend,
            history_leg=HistoryLeg(ran, weight, "\n".join(asked) if ran else ""),
        )


@dataclass(frozen=True)
class CondenseStrategy:
    """`MULTI_TURN_MODE=condense`: an LLM rewrite of every follow-up, fail-closed."""

    config: MultiTurnConfig
    embedder: Embedder
    llm: ChatLLM
    mode: Mode = "condense"

    async def plan(self, conversation: Conversation, steps: PlanSteps = UNTRACED) -> QueryPlan:
        condensed = await steps.rewrite(
            condense_follow_up(
                conversation,
                self.llm,
                history_turns=self.config.history_turns,
                timeout_seconds=self.config.condense_timeout_seconds,
                max_chars=self.config.condense_max_query_chars,
            )
        )
        vectors = await steps.embed(self.embedder.embed([condensed.query]))
        kind = KIND_STANDALONE if condensed.rewritten else KIND_MESSAGE
        return QueryPlan(
            mode=self.mode,
            strategy="condense" if condensed.rewritten else "stateless",
            text=condensed.query,
            embedding=vectors[0],
            rerank=RerankQuery(condensed.query, vectors[0], kind),
            condense=condensed,
        )


def build_strategy(
    config: MultiTurnConfig,
    *,
    embedder: Embedder,
    condense_llm: ChatLLM | None = None,
    translator: HistoryTranslator | None = None,
    bm25_history_supported: bool = True,
) -> MultiTurnStrategy:
    """The one strategy `config` names (the only place the mode is looked at)."""
    if config.mode == "condense":
        if condense_llm is None:
            raise ValueError("MULTI_TURN_MODE=condense needs a chat LLM for the rewrite")
        return CondenseStrategy(config, embedder, condense_llm)
    return BlendStrategy(config, embedder, translator, bm25_history_supported)
