"""Request models: how messages are read from the wire, and how unsupported ones are refused;
the OpenAPI document they make."""

from __future__ import annotations

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator

from chatqna.api.chat_schemas import ChatQnARequest
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


TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
ASK = {"role": "user", "content": "How do I export my data?"}
FOLLOW_UP = {"role": "user", "content": "And after I cancel?"}


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (
            [
                ASK,
                {"role": "assistant", "tool_calls": [TOOL_CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                FOLLOW_UP,
            ],
            "messages[2]: role 'tool' is not supported",
        ),
        (
            [ASK, {"role": "function", "name": "f", "content": "x"}, FOLLOW_UP],
            "messages[1]: role 'function' is not supported",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ],
            "messages[0]: content part 'image_url' is not supported",
        ),
        (
            [ASK, {"role": "assistant", "content": 42}, FOLLOW_UP],
            "messages[1]: content must be a string or a list of parts",
        ),
        ([{"role": "user", "content": {"text": "x"}}, FOLLOW_UP], "messages[0]: content must"),
        ([], "messages must not be empty"),
    ],
)
async def test_unsupported_messages_get_one_error_that_names_them(
    client_for: ClientFactory, messages: list[object], error: str
) -> None:
    client = await client_for()
    response = await client.post("/v1/chatqna", json={"messages": messages})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "invalid_request"
    assert len(body["details"]) == 1
    assert body["details"][0]["field"] == "messages"
    assert error in body["details"][0]["message"]


async def test_the_developer_role_is_a_system_message(
    client_for: ClientFactory, settings: Settings
) -> None:
    llm = ScriptedLLM()
    client = await client_for(await make_backends(settings, llm=llm), settings)
    messages = [{"role": "developer", "content": "Answer in French."}, ASK]
    response = await client.post("/v1/chatqna", json={"messages": messages, "stream": False})
    assert response.status_code == 200
    system = llm.prompts[-1][0]
    assert system["role"] == "system" and system["content"].startswith("Answer in French.")


async def test_the_served_openapi_document_is_valid_for_the_version_it_declares(
    client_for: ClientFactory,
) -> None:
    client = await client_for()
    document = (await client.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.1.")
    OpenAPIV31SpecValidator(document).validate()
    stream = document["paths"]["/v1/chatqna"]["post"]["responses"]["200"]["content"]
    # One event's schema, where a 3.1 reader looks for it (`itemSchema` is OpenAPI 3.2's).
    assert stream["text/event-stream"]["schema"]["required"] == ["data"]


@pytest.mark.parametrize(
    ("path", "streamed"), [("/v1/chatqna", True), ("/v1/chat/completions", False)]
)
async def test_a_null_stream_is_the_endpoints_default(
    client_for: ClientFactory, path: str, streamed: bool
) -> None:
    client = await client_for()
    response = await client.post(path, json={"messages": "How do I export?", "stream": None})
    assert response.status_code == 200, response.text
    media_type = "text/event-stream" if streamed else "application/json"
    assert response.headers["content-type"].startswith(media_type)
    # Still strict: a string is no switch.
    refused = await client.post(path, json={"messages": "How do I export?", "stream": "false"})
    assert refused.status_code == 422
    document = (await client.get("/openapi.json")).json()
    schema = document["components"]["schemas"]
    model = "ChatQnARequest" if streamed else "OpenAIChatRequest"
    assert schema[model]["properties"]["stream"]["type"] == ["boolean", "null"]
    assert schema[model]["properties"]["stream"]["default"] is streamed
