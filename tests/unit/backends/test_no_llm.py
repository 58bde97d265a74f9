"""The retriever service's chat LLM: ready as `none`, and every generation refused."""

from __future__ import annotations

import pytest

from chatqna.backends.no_llm import NoLLM
from chatqna.backends.protocols import ChatLLM, GenerationParams
from chatqna.errors import NotSupported

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hello?"}]


async def test_every_generation_is_refused_as_not_supported() -> None:
    llm: ChatLLM = NoLLM()
    with pytest.raises(NotSupported) as whole:
        await llm.complete(MESSAGES, GenerationParams())
    assert whole.value.status_code == 501
    with pytest.raises(NotSupported):
        llm.stream(MESSAGES, GenerationParams())


async def test_it_reports_itself_ready_and_closes() -> None:
    llm = NoLLM()
    assert llm.model == "none"
    assert await llm.describe() == {"kind": "none"}
    await llm.aclose()
