"""One turn through `Turn`: its answer streamed or whole, the observer, the turn's span, and a
client that leaves or stops reading."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.protocols import GenerationParams, Usage
from chatqna.errors import UpstreamError
from chatqna.pipeline.orchestrator import Pipeline
from chatqna.pipeline.record import TurnRecord
from chatqna.pipeline.turn import TurnOptions
from chatqna.settings import Settings
from chatqna.telemetry import names
from tests.unit.pipeline.conftest import CHAT, OPTIONS, Recorder, backends_for, finished

pytestmark = pytest.mark.anyio


class HeldLLM(ScriptedLLM):
    """A completion that never comes (until cancelled)."""

    async def complete(self, messages: Sequence[dict[str, str]], params: GenerationParams) -> Any:
        await asyncio.Event().wait()


async def test_a_streamed_turn_is_observed_once_per_step(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    observer = Recorder()
    llm = ScriptedLLM()
    pipeline = Pipeline.build(settings, await backends_for(settings, llm), observer)
    turn = await pipeline.prepare(CHAT, OPTIONS)
    assert observer.names() == ["planned", "selected"]
    planned: TurnRecord = observer.calls[0][1]
    assert planned.sources == () and planned.plan.strategy == "blend"
    record = turn.record()
    assert len(record.sources) == 2 and record.k == 4 and record.top_n == 2
    assert record.fusion is not None and record.rerank.reranker == "recording"
    assert record.trace_id is not None
    assert finished(spans, names.SPAN_ORCHESTRATE) is None, "open until the answer is done"
    async with turn:
        text = "".join([delta.text async for delta in turn.stream()])
    assert text == "This is the answer."
    assert observer.names()[2:] == ["generating", "generated", "answered"]
    # The stream's last delta carries the usage; the turn hands it on with the reason.
    prompt_words = sum(len(m["content"].split()) for m in llm.prompts[0])
    assert observer.calls[3][1] == ("stop", Usage(prompt_tokens=prompt_words, completion_tokens=4))
    answered: TurnRecord = observer.calls[-1][1]
    assert {"embed", "retrieve", "rerank", "first_token", "generate", "total"} <= set(
        answered.timings_ms
    )
    orchestrate = finished(spans, names.SPAN_ORCHESTRATE)
    generate = finished(spans, names.SPAN_GENERATE)
    assert orchestrate.status.status_code == StatusCode.UNSET
    assert generate.parent.span_id == orchestrate.context.span_id
    assert generate.end_time <= orchestrate.end_time


async def test_a_failed_answer_ends_the_turn_span_with_an_error(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    observer = Recorder()
    llm = ScriptedLLM(fail_after=1, error=UpstreamError("cut", backend="llm"))
    pipeline = Pipeline.build(settings, await backends_for(settings, llm), observer)
    turn = await pipeline.prepare(CHAT, OPTIONS)
    async with turn:
        with pytest.raises(UpstreamError):
            async for _delta in turn.stream():
                pass
    assert observer.names()[-1] == "failed" and "answered" not in observer.names()
    orchestrate = finished(spans, names.SPAN_ORCHESTRATE)
    assert orchestrate.status.status_code == StatusCode.ERROR
    assert finished(spans, names.SPAN_GENERATE).status.status_code == StatusCode.ERROR


async def test_a_turn_whose_client_left_mid_stream_ends_without_an_error(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    observer = Recorder()
    pipeline = Pipeline.build(settings, await backends_for(settings), observer)
    turn = await pipeline.prepare(CHAT, OPTIONS)
    async with turn:
        stream = turn.stream()
        await anext(stream)
        turn.client_left()  # as the response learns it, before it closes the answer
        await stream.aclose()
    assert "failed" not in observer.names() and "answered" not in observer.names()
    for name in (names.SPAN_GENERATE, names.SPAN_ORCHESTRATE):
        span = finished(spans, name)
        assert span.status.status_code == StatusCode.UNSET, name
        assert span.attributes[names.CLIENT_DISCONNECTED] is True, name
        assert not [event for event in span.events if event.name == "exception"], name


async def test_a_turn_whose_client_stopped_reading_ends_as_stalled_not_failed(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    observer = Recorder()
    pipeline = Pipeline.build(settings, await backends_for(settings), observer)
    turn = await pipeline.prepare(CHAT, OPTIONS)
    async with turn:
        stream = turn.stream()
        await anext(stream)
        turn.client_stalled()  # as the stream learns it at the deadline, before it closes
        await stream.aclose()
    assert "failed" not in observer.names() and "answered" not in observer.names()
    for name in (names.SPAN_GENERATE, names.SPAN_ORCHESTRATE):
        span = finished(spans, name)
        assert span.status.status_code == StatusCode.UNSET, name
        assert span.attributes[names.CLIENT_STALLED] is True, name
        assert names.CLIENT_DISCONNECTED not in span.attributes, name


async def test_a_cancelled_non_streamed_answer_whose_client_left_is_no_error(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    pipeline = Pipeline.build(settings, await backends_for(settings, HeldLLM()), Recorder())
    turn = await pipeline.prepare(CHAT, OPTIONS)

    async def answer() -> None:
        async with turn:
            await turn.complete()

    task = asyncio.ensure_future(answer())
    await asyncio.sleep(0)  # the completion is awaited
    turn.client_left()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for name in (names.SPAN_GENERATE, names.SPAN_ORCHESTRATE):
        span = finished(spans, name)
        assert span.status.status_code == StatusCode.UNSET, name
        assert span.attributes[names.CLIENT_DISCONNECTED] is True, name


async def test_an_upstream_failure_after_the_client_left_is_still_an_error(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    llm = ScriptedLLM(fail_after=1, error=UpstreamError("cut", backend="llm"))
    pipeline = Pipeline.build(settings, await backends_for(settings, llm), Recorder())
    turn = await pipeline.prepare(CHAT, OPTIONS)
    with pytest.raises(UpstreamError):
        async with turn:
            turn.client_left()
            async for _delta in turn.stream():
                pass
    for name in (names.SPAN_GENERATE, names.SPAN_ORCHESTRATE):
        span = finished(spans, name)
        assert span.status.status_code == StatusCode.ERROR, name
        assert names.CLIENT_DISCONNECTED not in span.attributes, name


async def test_a_cancelled_turn_whose_client_stayed_is_an_error(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    pipeline = Pipeline.build(settings, await backends_for(settings), Recorder())
    turn = await pipeline.prepare(CHAT, OPTIONS)
    async with turn:
        stream = turn.stream()
        await anext(stream)
        await stream.aclose()
    for name in (names.SPAN_GENERATE, names.SPAN_ORCHESTRATE):
        assert finished(spans, name).status.status_code == StatusCode.ERROR, name


async def test_a_streamed_answer_cut_at_max_tokens_reports_length_and_its_usage(
    settings: Settings,
) -> None:
    observer = Recorder()
    pipeline = Pipeline.build(settings, await backends_for(settings), observer)
    options = TurnOptions(k=4, top_n=2, params=GenerationParams(max_tokens=2))
    turn = await pipeline.prepare(CHAT, options)
    async with turn:
        text = "".join([delta.text async for delta in turn.stream()])
    assert text == "This is"
    finish, usage = observer.calls[3][1]
    assert finish == "length" and usage is not None and usage.completion_tokens == 2


async def test_a_non_streamed_answer(settings: Settings, spans: InMemorySpanExporter) -> None:
    observer = Recorder()
    pipeline = Pipeline.build(settings, await backends_for(settings), observer)
    turn = await pipeline.prepare(CHAT, OPTIONS)
    async with turn:
        completion = await turn.complete()
    assert completion.text == "This is the answer."
    assert observer.names()[-2:] == ["generated", "answered"]
    assert observer.calls[-2][1] == ("stop", completion.usage)
    assert "generate" in turn.record().timings_ms
    assert finished(spans, names.SPAN_ORCHESTRATE) is not None


def test_turn_options_take_k_and_top_n_from_the_settings_unless_asked() -> None:
    settings = Settings(retriever_k=7, rerank_top_n=3)
    params = GenerationParams(max_tokens=16)
    served = TurnOptions.from_settings(settings, params=params)
    assert served == TurnOptions(k=7, top_n=3, params=params)
    asked = TurnOptions.from_settings(settings, k=20, top_n=0, params=params)
    assert asked == TurnOptions(k=20, top_n=0, params=params)
