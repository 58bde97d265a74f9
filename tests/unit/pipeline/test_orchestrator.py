"""`Pipeline`: the observer it is built with; in `prepare`, the rewrite's span before the
turn's, and a failure before the answer that ends the turn's span and is observed."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.errors import CondenseFailed, UpstreamError
from chatqna.pipeline.orchestrator import Pipeline
from chatqna.settings import Settings
from chatqna.telemetry import names
from tests.unit.pipeline.conftest import CHAT, OPTIONS, Recorder, backends_for, finished

pytestmark = pytest.mark.anyio


async def test_a_failure_before_the_answer_ends_the_span_and_is_observed(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    class Broken(HashingEmbedder):
        async def embed(self, texts: Any) -> Any:
            raise UpstreamError("down", backend="embedder")

    observer = Recorder()
    backends = await backends_for(settings)
    backends.embedder = Broken()
    with pytest.raises(UpstreamError):
        await Pipeline.build(settings, backends, observer).prepare(CHAT, OPTIONS)
    assert observer.names() == ["failed"]
    assert finished(spans, names.SPAN_ORCHESTRATE).status.status_code == StatusCode.ERROR


async def test_a_failed_rewrite_opens_no_turn_span(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    condense = settings.model_copy(
        update={"multi_turn_mode": "condense", "multi_turn_blend_enabled": False}
    )
    observer = Recorder()
    backends = await backends_for(condense)
    backends.condense_llm = ScriptedLLM("not json")
    with pytest.raises(CondenseFailed):
        await Pipeline.build(condense, backends, observer).prepare(CHAT, OPTIONS)
    assert observer.names() == ["condense_failed", "failed"]
    assert finished(spans, names.SPAN_ORCHESTRATE) is None
    assert finished(spans, names.SPAN_QUERY_CONDENSE) is not None


async def test_a_rewrite_is_timed_and_observed_before_the_turn_span(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    condense = settings.model_copy(
        update={"multi_turn_mode": "condense", "multi_turn_blend_enabled": False}
    )
    observer = Recorder()
    backends = await backends_for(condense)
    backends.condense_llm = ScriptedLLM('{"standalone_query": "How long is data kept?"}')
    turn = await Pipeline.build(condense, backends, observer).prepare(CHAT, OPTIONS)
    async with turn:
        pass
    assert observer.names()[:2] == ["condensed", "planned"]
    record = turn.record()
    assert record.plan.strategy == "condense" and record.fusion is None
    assert list(record.timings_ms)[:2] == ["condense", "embed"]
    rewrite = finished(spans, names.SPAN_QUERY_CONDENSE)
    orchestrate = finished(spans, names.SPAN_ORCHESTRATE)
    assert rewrite.end_time <= orchestrate.start_time


async def test_an_observer_that_is_empty_is_still_the_observer(settings: Settings) -> None:
    class Counted(Recorder):
        """An observer that counts as falsy until it has been told something."""

        def __len__(self) -> int:
            return len(self.calls)

    observer = Counted()
    pipeline = Pipeline.build(settings, await backends_for(settings), observer)
    assert pipeline.observer is observer
    await pipeline.prepare(CHAT, OPTIONS)
    assert observer.names() == ["planned", "selected"]
