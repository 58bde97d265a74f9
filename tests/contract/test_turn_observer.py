"""The `TurnObserver` contract, over the silent observer (turns run outside the service) and
the telemetry observer (span attributes and metrics), with and without content on spans.

What every observer owes the pipeline: each hook takes what a turn hands it, answered,
failed or cancelled, without raising; the pipeline owns its spans, so no hook ends one;
and `generating` gives attributes a span can hold, or None when its parent records nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import INVALID_SPAN, Span

from chatqna.backends.protocols import GenerationParams, Usage
from chatqna.documents import Chunk, ScoredChunk
from chatqna.errors import CondenseFailed, UpstreamError, UpstreamTimeout
from chatqna.multiturn.blend import BlendResult
from chatqna.multiturn.condense import STATUS_OK, CondenseOutcome
from chatqna.multiturn.rerank_query import RerankQuery
from chatqna.multiturn.strategy import HistoryLeg, QueryPlan
from chatqna.multiturn.translate import TranslationReport
from chatqna.pipeline.observer import SilentObserver, TurnObserver
from chatqna.pipeline.record import Fusion, RerankRecord, TurnRecord
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.observer import TurnTelemetry

VECTOR = np.ones(4, dtype=np.float32)
PARAMS = GenerationParams(max_tokens=64, temperature=0.0)
SOURCE = ScoredChunk(
    chunk=Chunk(id="c1", text="Data is kept for 30 days.", source="retention.md", index=0),
    score=0.9,
    scores={"dense": 0.8, "bm25": 0.4},
)
REWRITE = CondenseOutcome(STATUS_OK, "How long is data kept?", "And then?", 2, 12.0, "m")
TRACER = TracerProvider().get_tracer("contract")


def blend_plan() -> QueryPlan:
    translation = TranslationReport(True, True, translated=1, from_cache=1, failed=0)
    blend = BlendResult(VECTOR, VECTOR, True, "executed", 0.7, 2, 2, translation=translation)
    return QueryPlan(
        mode="blend",
        strategy="blend",
        text="And then?",
        embedding=VECTOR,
        rerank=RerankQuery("And then? Refunds?", VECTOR, "conversation"),
        blend=blend,
        history_leg=HistoryLeg(True, 0.3, "Refunds?"),
    )


def condense_plan() -> QueryPlan:
    return QueryPlan(
        mode="condense",
        strategy="condense",
        text=REWRITE.query,
        embedding=VECTOR,
        rerank=RerankQuery(REWRITE.query, VECTOR, "standalone"),
        condense=REWRITE,
    )


def record(
    plan: QueryPlan,
    *,
    sources: tuple[ScoredChunk, ...] = (SOURCE,),
    timings_ms: dict[str, float] | None = None,
) -> TurnRecord:
    return TurnRecord(
        raw_query="And then?",
        history_messages=2,
        plan=plan,
        fusion=Fusion((1.0, 0.3), 60, 50) if plan.mode == "blend" else None,
        rerank=RerankRecord("tei", "") if sources else RerankRecord(None, "no_candidates"),
        hybrid=plan.mode == "blend",
        k=4,
        top_n=1,
        sources=sources,
        timings_ms=timings_ms if timings_ms is not None else {"retrieve": 2.0, "total": 9.5},
        trace_id=None,
    )


def condense_failure() -> CondenseFailed:
    failure = CondenseFailed("timeout", "no answer in 5 s")
    failure.__cause__ = UpstreamTimeout("condense_llm: timed out", backend="condense_llm")
    return failure


# Each turn is the hooks the pipeline calls, in its order, with what it hands them.
Turn = Callable[[TurnObserver, Span], None]


def answered_blend(observer: TurnObserver, span: Span) -> None:
    turn = record(blend_plan())
    observer.planned(span, turn)
    observer.selected(span, turn, 8)
    observer.generating(span, "qwen", PARAMS)
    observer.generated(span, Usage(120, 16), "stop")
    observer.answered(turn)


def answered_condense_without_usage(observer: TurnObserver, span: Span) -> None:
    turn = record(condense_plan())
    observer.condensed(span, REWRITE)
    observer.planned(span, turn)
    observer.selected(span, turn, 4)
    observer.generating(span, "qwen", GenerationParams())
    observer.generated(span, None, None)  # a server that reports neither
    observer.answered(turn)


def answered_from_no_sources(observer: TurnObserver, span: Span) -> None:
    turn = record(blend_plan(), sources=())
    observer.planned(span, turn)
    observer.selected(span, turn, 0)
    observer.generating(span, "qwen", PARAMS)
    observer.generated(span, Usage(), "length")
    observer.answered(turn)


def failed_rewrite(observer: TurnObserver, span: Span) -> None:
    failure = condense_failure()
    observer.condense_failed(span, failure)
    observer.failed(failure)


def failed_generation(observer: TurnObserver, span: Span) -> None:
    turn = record(blend_plan())
    observer.planned(span, turn)
    observer.selected(span, turn, 8)
    observer.generating(span, "qwen", PARAMS)
    observer.failed(UpstreamError("llm: HTTP 500", backend="llm"))


def failed_unexpectedly(observer: TurnObserver, span: Span) -> None:
    observer.failed(RuntimeError("a bug"))


def cancelled_before_its_answer(observer: TurnObserver, span: Span) -> None:
    # Planned, then its client left: the stage timings stop short of `total`.
    observer.planned(span, record(condense_plan(), timings_ms={"embed": 1.0}))
    observer.failed(asyncio.CancelledError())


TURNS: list[Turn] = [
    answered_blend,
    answered_condense_without_usage,
    answered_from_no_sources,
    failed_rewrite,
    failed_generation,
    failed_unexpectedly,
    cancelled_before_its_answer,
]


@pytest.fixture(params=["silent", "telemetry", "telemetry-with-content"])
def observer(request: pytest.FixtureRequest) -> TurnObserver:
    if request.param == "silent":
        return SilentObserver()
    return TurnTelemetry(ServiceMetrics(), record_content=request.param.endswith("content"))


@pytest.fixture
def span() -> Iterator[Span]:
    started = TRACER.start_span("chatqna.orchestrate")
    yield started
    started.end()


@pytest.mark.parametrize("turn", TURNS, ids=[turn.__name__ for turn in TURNS])
def test_every_hook_takes_what_the_turn_hands_it_and_leaves_the_span_open(
    observer: TurnObserver, span: Span, turn: Turn
) -> None:
    turn(observer, span)
    assert span.is_recording()  # the pipeline ends its spans, not the observer


@pytest.mark.parametrize("turn", TURNS, ids=[turn.__name__ for turn in TURNS])
def test_a_turn_on_spans_that_record_nothing_is_observed_all_the_same(
    observer: TurnObserver, turn: Turn
) -> None:
    turn(observer, INVALID_SPAN)  # tracing switched off, or the turn not sampled


def test_generating_gives_attributes_a_span_can_hold(observer: TurnObserver, span: Span) -> None:
    values = observer.generating(span, "qwen", PARAMS)
    if values is not None:
        child = TRACER.start_span("chatqna.generate", attributes=values)
        assert dict(child.attributes or {}) == values  # none dropped as invalid
        child.end()


def test_generating_under_a_parent_that_records_nothing_gives_none(
    observer: TurnObserver,
) -> None:
    assert observer.generating(INVALID_SPAN, "qwen", PARAMS) is None
