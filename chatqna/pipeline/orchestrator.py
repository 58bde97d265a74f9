"""One chat turn, top to bottom: plan the retrieval query, retrieve, rerank, then generate.

`Pipeline.prepare` does everything that must happen before the first byte goes out (so a
failure there is a clean HTTP error): it splits the conversation, asks the multi-turn
strategy (`chatqna.multiturn.strategy`, chosen once) for the turn's query plan, retrieves
(dense + BM25 + RRF, or dense only), reranks and builds the answer prompt. It returns a
`Turn`, whose `record()` is what the metadata event and the non-streaming body say, and
which generates the answer inside `async with turn:`.

Spans: the strategy's rewrite runs in `chatqna.query_condense` (condense mode), which ends
before `chatqna.orchestrate` starts (siblings under the request span); orchestrate starts
with the strategy's embedding step and is the turn's span until the answer is done.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from opentelemetry.trace import Span, Status, StatusCode

from chatqna.backends.bundle import Backends
from chatqna.documents import ScoredChunk
from chatqna.errors import CondenseFailed
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.history import Conversation, Message, split_conversation
from chatqna.multiturn.strategy import (
    MultiTurnConfig,
    MultiTurnStrategy,
    QueryPlan,
    build_strategy,
)
from chatqna.pipeline.observer import SilentObserver, TurnObserver
from chatqna.pipeline.prompt import build_answer_prompt
from chatqna.pipeline.record import Fusion, RerankRecord
from chatqna.pipeline.sources import rerank_or_cut, search_query
from chatqna.pipeline.turn import StageClock, Turn, TurnOptions, current
from chatqna.retrieval.fusion import FUSION_CANDIDATES
from chatqna.settings import Settings
from chatqna.telemetry import names
from chatqna.telemetry.tracing import tracer

T = TypeVar("T")


class TracedSteps:
    """The strategy's steps in their spans: the rewrite in `chatqna.query_condense`, the
    embedding in `chatqna.embed` under the turn's span, which the first embedding starts."""

    def __init__(self, observer: TurnObserver, clock: StageClock) -> None:
        self.observer = observer
        self.clock = clock
        self.span: Span | None = None

    def turn_span(self) -> Span:
        if self.span is None:
            self.span = tracer().start_span(names.SPAN_ORCHESTRATE)
        return self.span

    async def rewrite(self, work: Awaitable[CondenseOutcome]) -> CondenseOutcome:
        started = time.perf_counter()
        with tracer().start_as_current_span(
            names.SPAN_QUERY_CONDENSE, record_exception=False
        ) as span:
            try:
                outcome = await work
            except CondenseFailed as failure:
                self.observer.condense_failed(span, failure)
                raise
            self.observer.condensed(span, outcome)
        self.clock.record("condense", started)
        return outcome

    async def embed(self, work: Awaitable[T]) -> T:
        started = time.perf_counter()
        with current(self.turn_span()), tracer().start_as_current_span(names.SPAN_EMBED):
            result = await work
        self.clock.record("embed", started)
        return result


@dataclass(frozen=True)
class Pipeline:
    """The backends, the multi-turn strategy and the observer that every turn runs with."""

    backends: Backends
    strategy: MultiTurnStrategy
    settings: Settings
    observer: TurnObserver

    @classmethod
    def build(
        cls, settings: Settings, backends: Backends, observer: TurnObserver | None = None
    ) -> Pipeline:
        strategy = build_strategy(
            MultiTurnConfig.from_settings(settings),
            embedder=backends.embedder,
            condense_llm=backends.condense_llm,
            translator=backends.translator,
            bm25_history_supported=backends.retriever.supports_bm25_history,
        )
        return cls(backends, strategy, settings, SilentObserver() if observer is None else observer)

    async def prepare(self, messages: Sequence[Message], options: TurnOptions) -> Turn:
        """Everything before generation: a failure here is reported before any byte is sent."""
        clock = StageClock()
        conversation = split_conversation(messages)
        steps = TracedSteps(self.observer, clock)
        try:
            plan = await self.strategy.plan(conversation, steps)
            span = steps.turn_span()  # started by the plan's embedding
            with current(span):
                return await self._retrieve_and_rerank(conversation, plan, options, span, clock)
        except BaseException as exc:
            if steps.span is not None:
                steps.span.record_exception(exc)
                steps.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                steps.span.end()
            self.observer.failed(exc)
            raise

    async def _retrieve_and_rerank(
        self,
        conversation: Conversation,
        plan: QueryPlan,
        options: TurnOptions,
        span: Span,
        clock: StageClock,
    ) -> Turn:
        settings, reranker = self.settings, self.backends.reranker
        turn = Turn(
            conversation=conversation,
            plan=plan,
            fusion=self._fusion(plan),
            options=options,
            hybrid=settings.retriever_hybrid_retrieval_enabled,
            rerank=RerankRecord(
                reranker.name if reranker is not None else None,
                settings.rerank_skip_reason or "disabled",
            ),
            clock=clock,
            llm=self.backends.llm,
            observer=self.observer,
            span=span,
        )
        self.observer.planned(span, turn.record())
        candidates = await self._retrieve(plan, options, clock)
        turn.sources = await self._rerank(plan, candidates, options, clock)
        turn.prompt = build_answer_prompt(conversation, turn.sources)
        # Nothing runs under this span (it only records what was kept), so it is not made
        # current: `with selection` ends it.
        with tracer().start_span(names.SPAN_RERANKER_SELECTION) as selection:
            self.observer.selected(selection, turn.record(), len(candidates))
        return turn

    def _fusion(self, plan: QueryPlan) -> Fusion | None:
        """The fusion to report: none on a dense-only retrieval, which fuses nothing."""
        if plan.history_leg is None or not self.settings.retriever_hybrid_retrieval_enabled:
            return None
        return Fusion(self.settings.fusion_weights, self.settings.rrf_k, FUSION_CANDIDATES)

    async def _retrieve(
        self, plan: QueryPlan, options: TurnOptions, clock: StageClock
    ) -> list[ScoredChunk]:
        started = time.perf_counter()
        query = search_query(
            plan,
            options.k,
            hybrid=self.settings.retriever_hybrid_retrieval_enabled,
            fusion_weights=self.settings.fusion_weights,
        )
        with tracer().start_as_current_span(names.SPAN_RETRIEVE) as span:
            candidates = await self.backends.retriever.search(query)
            span.set_attribute(names.RETRIEVAL_CANDIDATES, len(candidates))
        clock.record("retrieve", started)
        return candidates

    async def _rerank(
        self,
        plan: QueryPlan,
        candidates: list[ScoredChunk],
        options: TurnOptions,
        clock: StageClock,
    ) -> list[ScoredChunk]:
        reranker = self.backends.reranker
        if reranker is None:  # the cut is no stage: no span, no time recorded
            return await rerank_or_cut(None, plan.rerank, candidates, options.top_n)
        started = time.perf_counter()
        with tracer().start_as_current_span(names.SPAN_RERANK):
            sources = await rerank_or_cut(reranker, plan.rerank, candidates, options.top_n)
        clock.record("rerank", started)
        return sources
