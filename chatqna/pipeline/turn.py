"""A prepared turn: its sources are chosen and its prompt built; the answer is still to come.

`Turn` is an async context manager that owns the turn's `chatqna.orchestrate` span for the
whole answer: the span ends when the `async with` block ends, with an ERROR status when
the block or the answer failed. Inside, `stream()` (or `complete()`) generates the answer
in its `chatqna.generate` span, which ends with the stream.

A turn stopped because its client left (`client_left()`, called before the answer is
cancelled or closed) failed nowhere: both spans end without an error status and carry
`chatqna.client_disconnected=true`. So does one whose client stopped reading the answer
until its deadline (`client_stalled()`), with `chatqna.client_stalled=true`: the LLM did
nothing wrong, so no upstream error is counted. An upstream error is still a failure,
client or not.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from chatqna.backends.protocols import ChatLLM, Completion, Delta, GenerationParams, Usage
from chatqna.documents import ScoredChunk
from chatqna.multiturn.history import Conversation
from chatqna.multiturn.strategy import QueryPlan
from chatqna.pipeline.observer import TurnObserver
from chatqna.pipeline.record import Fusion, RerankRecord, TurnRecord
from chatqna.telemetry import names
from chatqna.telemetry.tracing import tracer

if TYPE_CHECKING:
    from chatqna.settings import Settings


@dataclass(frozen=True)
class TurnOptions:
    """Per-request knobs: retrieval depth `k`, chunks kept `top_n`, and sampling."""

    k: int
    top_n: int
    params: GenerationParams

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        k: int | None = None,
        top_n: int | None = None,
        params: GenerationParams,
    ) -> TurnOptions:
        """A turn's options: `k` and `top_n` as asked, or else `RETRIEVER_K` and
        `RERANK_TOP_N`, with the sampling `params`."""
        return cls(
            k=k if k is not None else settings.retriever_k,
            top_n=top_n if top_n is not None else settings.rerank_top_n,
            params=params,
        )


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


def current(span: Span) -> AbstractContextManager[Span]:
    """`span` current for the block, which ends, records and sets no status itself."""
    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


@dataclass(eq=False)
class Turn:
    """A turn ready to answer; `async with turn:` ends its span when the answer is done."""

    conversation: Conversation
    plan: QueryPlan
    fusion: Fusion | None
    options: TurnOptions
    hybrid: bool
    rerank: RerankRecord
    clock: StageClock
    llm: ChatLLM
    observer: TurnObserver
    span: Span
    sources: list[ScoredChunk] = field(default_factory=list)
    prompt: list[dict[str, str]] = field(default_factory=list)
    error: BaseException | None = None
    ended: bool = False
    left_by_client: bool = False
    reader_stalled: bool = False

    def record(self) -> TurnRecord:
        """The turn's record as of now (the metadata event is sent before generation)."""
        return TurnRecord(
            raw_query=self.conversation.query,
            history_messages=len(self.conversation.history),
            plan=self.plan,
            fusion=self.fusion,
            rerank=self.rerank,
            hybrid=self.hybrid,
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

    async def __aenter__(self) -> Turn:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.ended:
            return
        self.ended = True
        error = exc if exc is not None else self.error
        if not self._stopped_for_client(self.span, error) and error is not None:
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()

    def client_left(self) -> None:
        """The client has gone: the cancellation or close that follows is not a failure."""
        self.left_by_client = True

    def client_stalled(self) -> None:
        """The client stopped reading the answer until its deadline, without leaving: the
        close that follows is not a failure (of the LLM's least of all)."""
        self.reader_stalled = True

    def _stopped_for_client(self, span: Span, error: BaseException | None) -> bool:
        """Whether the turn ends (with `error`, if any) after its client left or stalled,
        which `span` is then marked with: nothing, a cancellation or a generator's close
        (no `Exception`s) is how it was stopped. An upstream error raised meanwhile is
        still the turn's failure."""
        if isinstance(error, Exception) or not (self.left_by_client or self.reader_stalled):
            return False
        if self.left_by_client:
            span.set_attribute(names.CLIENT_DISCONNECTED, True)
        if self.reader_stalled:
            span.set_attribute(names.CLIENT_STALLED, True)
        return True

    async def close(self) -> None:
        """End the turn's span if nothing has (a response that never started streaming)."""
        await self.__aexit__(None, None, None)

    async def stream(self) -> AsyncIterator[Delta]:
        """The answer, piece by piece, in the `chatqna.generate` span."""
        span = self._generation_span()
        started = time.perf_counter()
        first = True
        usage: Usage | None = None
        finish: str | None = None
        try:
            with current(span):
                async for delta in self.llm.stream(self.prompt, self.options.params):
                    if first and delta.text:
                        elapsed = round((time.perf_counter() - started) * 1000, 3)
                        self.clock.stages["first_token"] = elapsed
                        span.add_event(names.EVENT_FIRST_TOKEN, {"elapsed_ms": elapsed})
                        first = False
                    usage = delta.usage or usage
                    finish = delta.finish_reason or finish
                    yield delta
        except BaseException as exc:  # includes the cancellation of a disconnected client
            self._generation_failed(span, started, exc)
            raise
        self._generation_done(span, started, usage, finish)

    async def complete(self) -> Completion:
        """The whole answer at once (non-streaming requests)."""
        span = self._generation_span()
        started = time.perf_counter()
        try:
            with current(span):
                completion = await self.llm.complete(self.prompt, self.options.params)
        except BaseException as exc:
            self._generation_failed(span, started, exc)
            raise
        self._generation_done(span, started, completion.usage, completion.finish_reason)
        return completion

    def _generation_span(self) -> Span:
        return tracer().start_span(
            names.SPAN_GENERATE,
            context=trace.set_span_in_context(self.span),
            attributes=self.observer.generating(self.span, self.llm.model, self.options.params),
        )

    def _stop_clock(self, started: float) -> None:
        self.clock.stages["generate"] = round((time.perf_counter() - started) * 1000, 3)
        self.clock.stages["total"] = self.clock.total_ms()

    def _generation_failed(self, span: Span, started: float, exc: BaseException) -> None:
        self._stop_clock(started)
        if self._stopped_for_client(span, exc):
            span.end()
            return
        self.error = exc
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.end()
        self.observer.failed(exc)

    def _generation_done(
        self, span: Span, started: float, usage: Usage | None, finish: str | None
    ) -> None:
        self._stop_clock(started)
        self.observer.generated(span, usage, finish)
        span.end()
        self.observer.answered(self.record())
