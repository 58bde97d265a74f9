"""The `ChatLLM` contract, over the embedded llama.cpp model (slow: loads the packaged GGUF
and serves it on loopback), an OpenAI-compatible server, and the scripted stand-in the unit
tests answer with (given the stand-in server's reply, so `max_tokens` cuts it too)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx2
import pytest

from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.protocols import ChatLLM, Delta, GenerationParams
from chatqna.errors import ContextTooLong
from chatqna.settings import Settings
from tests.contract import wire

pytestmark = pytest.mark.anyio

MESSAGES = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "How long do refunds for annual plans take?"},
]
GREEDY = GenerationParams(max_tokens=8, temperature=0.0, seed=7)
# Far beyond the 2,048 tokens the embedded model is started with here, and the stand-in's.
TOO_LONG = [{"role": "user", "content": " ".join(f"item{i}" for i in range(3000))}]


@pytest.fixture(
    scope="module",
    params=["openai", "fake", pytest.param("local", marks=pytest.mark.slow)],
)
async def llm(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[ChatLLM]:
    built: ChatLLM
    if request.param == "openai":
        built = OpenAIChatLLM(
            "http://llm.test/v1", "contract-model", transport=httpx2.MockTransport(wire.openai_chat)
        )
    elif request.param == "fake":
        built = ScriptedLLM(wire.REPLY, context=2048)
    else:
        from chatqna.backends.local_llm import LlamaCppLLM

        built = await LlamaCppLLM.start(Settings().embedded_gguf(), context=2048, threads=2)
    yield built
    await built.aclose()


async def collect(llm: ChatLLM, params: GenerationParams = GREEDY) -> list[Delta]:
    return [delta async for delta in llm.stream(MESSAGES, params)]


def test_it_is_a_chat_llm(llm: ChatLLM) -> None:
    assert isinstance(llm, ChatLLM) and llm.model


async def test_a_completion_has_text_a_reason_and_stays_within_max_tokens(llm: ChatLLM) -> None:
    completion = await llm.complete(MESSAGES, GREEDY)
    assert completion.text.strip()
    assert completion.finish_reason in ("stop", "length")
    assert 0 < completion.usage.completion_tokens <= 8
    assert completion.usage.prompt_tokens > 0


async def test_a_stream_ends_with_a_finish_reason_and_reports_usage(llm: ChatLLM) -> None:
    deltas = await collect(llm)
    assert "".join(d.text for d in deltas).strip()
    reasons = [d.finish_reason for d in deltas if d.finish_reason is not None]
    assert len(reasons) == 1 and reasons[0] in ("stop", "length")
    usages = [d.usage for d in deltas if d.usage is not None]
    assert usages and 0 < usages[-1].completion_tokens <= 8


async def test_greedy_stream_and_completion_say_the_same(llm: ChatLLM) -> None:
    whole = await llm.complete(MESSAGES, GREEDY)
    streamed = "".join(d.text for d in await collect(llm))
    assert streamed == whole.text


async def test_a_real_zero_temperature_is_repeatable(llm: ChatLLM) -> None:
    first = await llm.complete(MESSAGES, GREEDY)
    second = await llm.complete(MESSAGES, GREEDY)
    assert first.text == second.text


async def test_a_stream_closed_early_leaves_the_model_usable(llm: ChatLLM) -> None:
    params = GenerationParams(max_tokens=32, temperature=0.0)
    stream = llm.stream(MESSAGES, params)
    async with contextlib.aclosing(stream):
        async for delta in stream:
            if delta.text:
                break
    assert (await llm.complete(MESSAGES, GREEDY)).text.strip()


async def test_describe_names_the_model(llm: ChatLLM) -> None:
    details = await llm.describe()
    assert isinstance(details["kind"], str) and details["model"] == llm.model


async def test_a_prompt_beyond_the_context_is_context_too_long(llm: ChatLLM) -> None:
    with pytest.raises(ContextTooLong):
        await llm.complete(TOO_LONG, GREEDY)
    with pytest.raises(ContextTooLong):
        await collect_from(llm.stream(TOO_LONG, GREEDY))
    assert (await llm.complete(MESSAGES, GREEDY)).text.strip(), "the model stays usable"


async def collect_from(stream: AsyncIterator[Delta]) -> list[Delta]:
    return [delta async for delta in stream]
