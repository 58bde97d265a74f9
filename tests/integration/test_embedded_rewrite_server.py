"""Two users on the embedded LLM: while one user's long answer streams, another user's
condense rewrite and history translation are served (slow: loads the packaged GGUF).

An embedded llama.cpp server generates in one slot, one request at a time. Queued behind
another user's answer there, a rewrite would spend its timeout waiting and fail the turn
(503 `condense_failed`, reason `timeout`), and a translation would be given up. They run on
a second server of their own (`chatqna.composition.build_rewrite_llm`; the default,
`CHATQNA_LLM_REWRITE_SERVER=true`). Each case builds the backends as `chatqna serve` does,
starts a long answer, and checks that the rewrite or the translation returns while the
answer is still streaming.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from chatqna.backends.bundle import Backends
from chatqna.backends.protocols import ChatLLM, GenerationParams
from chatqna.composition import build_backends
from chatqna.multiturn.condense import condense_follow_up
from chatqna.multiturn.history import Conversation, Message
from chatqna.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

T = TypeVar("T")

LONG_ANSWER = [
    {
        "role": "user",
        "content": "Write a very long, detailed essay about every feature of the product, "
        "repeating each section in full many times.",
    }
]
# About two seconds of generation for the packaged model on one thread: several times what
# a warm rewrite or two short translations take (a quarter of a second each).
ANSWER_PARAMS = GenerationParams(max_tokens=200, temperature=0.0)
FOLLOW_UP = Conversation(
    query="Is that possible after I cancel?",
    history=(
        Message("user", "How do I export my data?"),
        Message("assistant", "Open Settings > Workspace > Export."),
    ),
)
FRENCH_HISTORY = (
    Message("user", "Comment exporter les données de mon espace de travail ?"),
    Message("assistant", "Ouvrez Paramètres puis Exporter."),
)


async def while_answering(llm: ChatLLM, other: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
    """Run `other` alone (its first call also loads what it needs, such as the grammar of
    a JSON reply), then again once `llm` streams a long answer; return what the second run
    returned, and whether the answer was still streaming then."""
    await other()
    started, ended = asyncio.Event(), asyncio.Event()

    async def answer() -> int:
        tokens = 0
        async for delta in llm.stream(LONG_ANSWER, ANSWER_PARAMS):
            started.set()
            if delta.usage is not None:
                tokens = delta.usage.completion_tokens
        ended.set()
        return tokens

    streaming = asyncio.create_task(answer())
    try:
        first = asyncio.create_task(started.wait())
        await asyncio.wait({streaming, first}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        assert started.is_set(), "the answer never started"
        result = await other()
        still_streaming = not ended.is_set()
        assert await streaming >= 100, "the answer was too short to keep its server busy"
    finally:
        streaming.cancel()
    return result, still_streaming


def embedded(tmp_path: Path, **overrides: object) -> Settings:
    # One thread per llama.cpp server: the answer and the rewrite never fight for a core
    # on a two-core runner, so their speeds, not the scheduler, decide the timing.
    return Settings(chatqna_data_dir=tmp_path, chatqna_llm_threads=1, **overrides)  # type: ignore[arg-type]


async def test_a_condense_rewrite_is_not_held_up_by_another_user_s_answer(
    tmp_path: Path,
) -> None:
    settings = embedded(tmp_path, multi_turn_mode="condense")
    backends: Backends = await build_backends(settings)
    try:
        outcome, still_streaming = await while_answering(
            backends.llm,
            lambda: condense_follow_up(
                FOLLOW_UP,
                backends.condense_llm,
                history_turns=settings.multi_turn_history_turns,
                timeout_seconds=settings.condense_timeout_seconds,
                max_chars=settings.condense_max_query_chars,
            ),
        )
    finally:
        await backends.aclose()
    assert outcome.rewritten
    assert still_streaming, "the rewrite waited for the other user's answer to finish"


async def test_a_history_translation_is_not_held_up_by_another_user_s_answer(
    tmp_path: Path,
) -> None:
    # No cache: the second run translates again instead of reading the first one's results.
    settings = embedded(
        tmp_path, multi_turn_blend_enabled=True, multi_turn_translation_cache_size=0
    )
    backends: Backends = await build_backends(settings)
    translator = backends.translator
    assert translator is not None
    try:
        outcome, still_streaming = await while_answering(
            backends.llm, lambda: translator.normalise(FRENCH_HISTORY)
        )
    finally:
        await backends.aclose()
    assert (outcome.translated, outcome.failed) == (2, 0)
    assert still_streaming, "the translations waited for the other user's answer to finish"
