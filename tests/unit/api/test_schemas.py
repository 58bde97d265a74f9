"""Request models: how messages are read from the wire, and how unsupported ones are refused."""

from __future__ import annotations

import pytest

from chatqna.api.schemas import ChatQnARequest
from chatqna.backends.fakes import ScriptedLLM
from chatqna.multiturn.history import Message
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends

pytestmark = pytest.mark.anyio


def test_text_parts_are_joined_one_per_line() -> None:
    parts = [{"type": "text", "text": "How do I export"}, {"type": "text", "text": "my data?"}]
    body = ChatQnARequest.model_validate({"messages": [{"role": "user", "content": parts}]})
    assert body.chat_messages() == [Message("user", "How do I export\nmy data?")]


async def test_the_query_of_a_multi_part_message_keeps_its_words_apart(
    client_for: ClientFactory, settings: Settings
) -> None:
    llm = ScriptedLLM()
    client = await client_for(await make_backends(settings, llm=llm), settings)
    parts = [{"type": "text", "text": "How do I export"}, {"type": "text", "text": "my data?"}]
    message = {"role": "user", "content": parts}
    response = await client.post("/v1/chatqna", json={"messages": [message], "stream": False})
    assert response.status_code == 200
    assert response.json()["metadata"]["retrieval"]["query"] == "How do I export\nmy data?"
    assert llm.prompts[-1][-1]["content"] == "How do I export\nmy data?"
