"""One chat turn, top to bottom: plan the retrieval query, retrieve, rerank, then generate.

`handle_request` does everything that must happen before the first byte goes out (so a
failure there is a clean HTTP error): it splits the conversation, reads `MULTI_TURN_MODE`
to decide what the retriever searches with, embeds, retrieves (dense + BM25 + RRF, or
dense only), reranks and builds the answer prompt. It returns a `PreparedTurn`, whose
`record()` (a `chatqna.pipeline.record.TurnRecord`, built once) is what the SSE metadata
event and the non-streaming body say, and whose answer is streamed by `generate`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode

from chatqna.backends.bundle import Backends
from chatqna.backends.protocols import (
    Completion,
    Delta,
    Embedder,
    GenerationParams,
    SearchQuery,
    Usage,
)
from chatqna.documents import ScoredChunk
from chatqna.errors import CondenseFailed
from chatqna.multiturn.blend import blend_query, earlier_questions
from chatqna.multiturn.condense import CondenseOutcome, condense_follow_up
from chatqna.multiturn.history import Conversation, Message, split_conversation
from chatqna.multiturn.rerank_query import (
    KIND_CONVERSATION,
    KIND_MESSAGE,
    KIND_STANDALONE,
    RerankQuery,
    conversation_text,
)
from chatqna.multiturn.translate import HistoryTranslator
from chatqna.pipeline.prompt import build_answer_prompt
from chatqna.pipeline.record import Fusion, RerankRecord, RetrievalReport, TurnRecord
from chatqna.retrieval.fusion import FUSION_CANDIDATES
from chatqna.settings import Settings
from chatqna.telemetry import attributes, names
from chatqna.telemetry.tracing import tracer


@dataclass(frozen=True)
class TurnOptions:
    """Per-request knobs: retrieval depth `k`, chunks kept `top_n`, and sampling."""

    k: int
    top_n: int
    params: GenerationParams


@dataclass(frozen=True)
class RetrievalPlan:
    """What the retriever and reranker receive for this turn, and why.

    `embedding` drives the dense leg; `text` drives the BM25 leg; `rerank` is what the
    reranker scores against. `report` is the record of how the query was made.
    """

    text: str
    embedding: np.ndarray
    report: RetrievalReport
    rerank: RerankQuery
    bm25_history: str = ""
    bm25_history_weight: float = 0.0


@dataclass
class StageClock:
    """Milliseconds spent per pipeline stage, in the order the stages ran."""

    started: float = field(default_factory=time.perf_counter)
    stages: dict[str, float] = field(default_factory=dict)

    def record(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.stages[stage] = round((now - since) * 1000.0, 3)
        return now

    def total_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000.0, 3)


@dataclass
class PreparedTurn:
    """A turn whose sources are chosen and whose answer prompt is ready."""

    conversation: Conversation
    plan: RetrievalPlan
    sources: list[ScoredChunk]
    prompt: list[dict[str, str]]
    options: TurnOptions
    settings: Settings
    clock: StageClock
    reranker: str | None
    span: Span = INVALID_SPAN

    def record(self) -> TurnRecord:
        """The turn's record as of now (the metadata event is sent before generation)."""
        reranker = self.reranker
        return TurnRecord(
            retrieval=self.plan.report,
            rerank=RerankRecord(
                reranker, self.settings.rerank_skip_reason or "disabled", self.plan.rerank
            ),
            hybrid=self.settings.retriever_hybrid_retrieval_enabled,
            k=self.options.k,
            top_n=self.options.top_n,
            sources=tuple(self.sources),
            timings_ms=dict(self.clock.stages),
            trace_id=self.trace_id,
        )

    @property
    def trace_id(self) -> str | None:
        context = self.span.get_span_context()
        return trace.format_trace_id(context.trace_id) if context.is_valid else None


async def plan_retrieval(
    conversation: Conversation,
    embedder: Embedder,
    settings: Settings,
    *,
    translator: HistoryTranslator | None = None,
    bm25_history_supported: bool = True,
    condensed: CondenseOutcome | None = None,
) -> RetrievalPlan:
    """Decide what the retriever and the reranker search with, by `MULTI_TURN_MODE`.

    condense: the standalone query (or, with no history, the raw message) drives the dense
    leg, BM25 and the reranker. blend: the dense leg searches with the blended vector (or the
    query's own vector when the blend does not run); BM25 gets the isolated query text, and
    on a blended follow-up BM25 also hears the earlier questions at
    `MULTI_TURN_BM25_HISTORY_WEIGHT` (where the retriever supports it) and the reranker
    scores against the conversation (`MULTI_TURN_RERANK_QUERY`, see
    `chatqna.multiturn.rerank_query`). The benchmark harness plans its turns with this too.
    """
    if condensed is not None:
        vectors = await embedder.embed([condensed.query])
        kind = KIND_STANDALONE if condensed.rewritten else KIND_MESSAGE
        rerank = RerankQuery(condensed.query, vectors[0], kind)
        report = RetrievalReport(
            multi_turn_mode=settings.multi_turn_mode,
            strategy="condense" if condensed.rewritten else "stateless",
            raw_query=conversation.query,
            query=condensed.query,
            history_messages=len(conversation.history),
            condense=condensed,
        )
        return RetrievalPlan(condensed.query, vectors[0], report, rerank)
    blend = await blend_query(
        conversation,
        embedder,
        enabled=settings.blend_active,
        alpha=settings.multi_turn_blend_alpha,
        history_turns=settings.multi_turn_history_turns,
        translator=translator,
        order=settings.multi_turn_history_order,
        roles=settings.multi_turn_history_roles,
        assistant_weight=settings.multi_turn_assistant_weight,
    )
    # The history-aware BM25 leg and the conversation's rerank query run only when the
    # blend ran, so a first turn keeps exactly the stateless ranking. The OPEA retriever API
    # has no field for earlier questions: such a retriever keeps BM25 plain.
    weight = settings.multi_turn_bm25_history_weight
    asked = earlier_questions(conversation) if blend.executed else ()
    history_leg = bool(asked) and weight > 0.0 and bm25_history_supported
    if blend.executed and settings.multi_turn_rerank_query == KIND_CONVERSATION:
        text = conversation_text(conversation.query, asked)
        rerank = RerankQuery(text, blend.embedding, KIND_CONVERSATION)
    else:
        rerank = RerankQuery(conversation.query, blend.query_embedding, KIND_MESSAGE)
    dense, sparse = settings.fusion_weights
    report = RetrievalReport(
        multi_turn_mode=settings.multi_turn_mode,
        strategy="blend" if blend.executed else "stateless",
        raw_query=conversation.query,
        query=conversation.query,
        history_messages=len(conversation.history),
        blend=blend,
        fusion=Fusion(
            weights=(dense, sparse),
            rrf_k=settings.rrf_k,
            candidates=FUSION_CANDIDATES,
            bm25_history_ran=history_leg,
            bm25_history_weight=weight,
        ),
    )
    return RetrievalPlan(
        text=conversation.query,
        embedding=blend.embedding,
        report=report,
        rerank=rerank,
        bm25_history="\n".join(asked) if history_leg else "",
        bm25_history_weight=weight if history_leg else 0.0,
    )


async def condense_step(
    conversation: Conversation, backends: Backends, settings: Settings
) -> CondenseOutcome | None:
    """In condense mode, rewrite the follow-up (raises `CondenseFailed`); else nothing."""
    if settings.multi_turn_mode != "condense":
        return None
    return await condense_follow_up(
        conversation,
        backends.condense_llm,
        history_turns=settings.multi_turn_history_turns,
        timeout_seconds=settings.condense_timeout_seconds,
        max_chars=settings.condense_max_query_chars,
    )


async def handle_request(
    messages: Sequence[Message], options: TurnOptions, backends: Backends, settings: Settings
) -> PreparedTurn:
    """Everything before generation: a failure here is reported before any byte is sent.

    In condense mode the rewrite runs first, in its own `chatqna.query_condense` span that
    ends before `chatqna.orchestrate` starts (siblings under the request span). The
    orchestrate span stays open until the answer has been generated.
    """
    clock = StageClock()
    conversation = split_conversation(messages)
    condensed = await condense_traced(conversation, backends, settings, clock)

    span = tracer().start_span(names.SPAN_ORCHESTRATE)
    try:
        with current(span):
            turn = await _retrieve_and_rerank(
                conversation, condensed, options, backends, settings, clock
            )
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.end()
        raise
    turn.span = span
    return turn


def current(span: Span) -> AbstractContextManager[Span]:
    """`span` current for the block, which ends, records and sets no status itself."""
    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


async def condense_traced(
    conversation: Conversation, backends: Backends, settings: Settings, clock: StageClock
) -> CondenseOutcome | None:
    """The condense step in its `chatqna.query_condense` span (condense mode only)."""
    if settings.multi_turn_mode != "condense":
        return None
    started = time.perf_counter()
    with tracer().start_as_current_span(names.SPAN_QUERY_CONDENSE, record_exception=False) as span:
        try:
            outcome = await condense_step(conversation, backends, settings)
        except CondenseFailed as failure:
            attributes.condense_failed(span, failure)
            raise
        assert outcome is not None
        attributes.condense_ok(span, outcome, settings.chatqna_trace_content)
    clock.record("condense", started)
    return outcome


async def _retrieve_and_rerank(
    conversation: Conversation,
    condensed: CondenseOutcome | None,
    options: TurnOptions,
    backends: Backends,
    settings: Settings,
    clock: StageClock,
) -> PreparedTurn:
    mark = time.perf_counter()
    with tracer().start_as_current_span(names.SPAN_EMBED):
        plan = await plan_retrieval(
            conversation,
            backends.embedder,
            settings,
            translator=backends.translator,
            bm25_history_supported=backends.retriever.supports_bm25_history,
            condensed=condensed,
        )
    mark = clock.record("embed", mark)
    attributes.orchestrate(
        trace.get_current_span(),
        plan.report,
        options.k,
        options.top_n,
        settings.retriever_hybrid_retrieval_enabled,
        settings.chatqna_trace_content,
    )

    with tracer().start_as_current_span(names.SPAN_RETRIEVE) as retrieve_span:
        candidates = await backends.retriever.search(
            SearchQuery(
                text=plan.text,
                embedding=plan.embedding,
                k=options.k,
                hybrid=settings.retriever_hybrid_retrieval_enabled,
                fusion_weights=settings.fusion_weights,
                bm25_history=plan.bm25_history,
                bm25_history_weight=plan.bm25_history_weight,
            )
        )
        retrieve_span.set_attribute(names.RETRIEVAL_CANDIDATES, len(candidates))
    mark = clock.record("retrieve", mark)

    reranker = backends.reranker
    if reranker is not None:
        with tracer().start_as_current_span(names.SPAN_RERANK):
            sources = await reranker.rerank(
                plan.rerank.text, candidates, options.top_n, vector=plan.rerank.vector
            )
        clock.record("rerank", mark)
    else:
        sources = candidates[: options.top_n]
    # Nothing runs under this span (it only records what was kept), so it is not made
    # current: `with span` ends it.
    with tracer().start_span(names.SPAN_RERANKER_SELECTION) as selection:
        attributes.reranker_selection(
            selection,
            reranker.name if reranker else None,
            len(candidates),
            sources,
            plan.rerank,
            settings.chatqna_trace_content,
        )

    return PreparedTurn(
        conversation=conversation,
        plan=plan,
        sources=sources,
        prompt=build_answer_prompt(conversation, sources),
        options=options,
        settings=settings,
        clock=clock,
        reranker=reranker.name if reranker is not None else None,
    )


def _generation_span(turn: PreparedTurn, backends: Backends) -> Span:
    return tracer().start_span(
        names.SPAN_GENERATE,
        context=trace.set_span_in_context(turn.span),
        attributes=attributes.generation(turn.span, backends.llm.model, turn.options.params),
    )


def _finish(
    turn: PreparedTurn,
    span: Span,
    started: float,
    error: BaseException | None,
    usage: Usage | None,
    finish_reason: str | None,
) -> None:
    turn.clock.stages["generate"] = round((time.perf_counter() - started) * 1000, 3)
    turn.clock.stages["total"] = turn.clock.total_ms()
    if usage is not None:
        span.set_attribute(names.GEN_AI_INPUT_TOKENS, usage.prompt_tokens)
        span.set_attribute(names.GEN_AI_OUTPUT_TOKENS, usage.completion_tokens)
    if finish_reason:
        span.set_attribute(names.GEN_AI_FINISH_REASON, [finish_reason])
    for open_span in (span, turn.span):
        if error is not None:
            open_span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        open_span.end()


async def generate(turn: PreparedTurn, backends: Backends) -> AsyncIterator[Delta]:
    """Stream the answer; the generation span (and orchestrate) end when the stream ends."""
    span = _generation_span(turn, backends)
    started = time.perf_counter()
    first = True
    usage: Usage | None = None
    finish: str | None = None
    error: BaseException | None = None
    try:
        with current(span):
            async for delta in backends.llm.stream(turn.prompt, turn.options.params):
                if first and delta.text:
                    elapsed = round((time.perf_counter() - started) * 1000, 3)
                    turn.clock.stages["first_token"] = elapsed
                    span.add_event(names.EVENT_FIRST_TOKEN, {"elapsed_ms": elapsed})
                    first = False
                usage = delta.usage or usage
                finish = delta.finish_reason or finish
                yield delta
    except BaseException as exc:  # includes the cancellation of a disconnected client
        error = exc
        span.record_exception(exc)
        raise
    finally:
        _finish(turn, span, started, error, usage, finish)


async def complete(turn: PreparedTurn, backends: Backends) -> Completion:
    """The whole answer at once (non-streaming requests)."""
    span = _generation_span(turn, backends)
    started = time.perf_counter()
    try:
        with current(span):
            completion = await backends.llm.complete(turn.prompt, turn.options.params)
    except BaseException as exc:
        span.record_exception(exc)
        _finish(turn, span, started, exc, None, None)
        raise
    _finish(turn, span, started, None, completion.usage, completion.finish_reason)
    return completion
