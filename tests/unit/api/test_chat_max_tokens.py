"""`max_tokens` beyond `LLM_MAX_TOKENS_LIMIT` is refused by both chat endpoints, streamed or
not, before any backend is called; a request at the limit is answered."""

from __future__ import annotations

import pytest

from chatqna.api.chat_schemas import ChatQnARequest
from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import (
    HashingEmbedder,
    RecordingReranker,
    RecordingRetriever,
    ScriptedLLM,
)
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends

pytestmark = pytest.mark.anyio

CHAT_PATHS = ["/v1/chatqna", "/v1/chat/completions"]
# A follow-up in condense mode: a turn that is let through calls every backend, the rewrite
# included, so a refusal that calls none of them was made before the turn started.
TWO_TURNS = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings and choose Export."},
    {"role": "user", "content": "Can I still do that after cancelling?"},
]


@pytest.fixture
def condense(settings: Settings) -> Settings:
    return settings.model_copy(update={"multi_turn_mode": "condense"})


async def recording_backends(settings: Settings) -> Backends:
    llm = ScriptedLLM('{"standalone_query": "Can I export my data after cancelling?"}')
    backends = await make_backends(
        settings, embedder=HashingEmbedder(), reranker=RecordingReranker(), llm=llm
    )
    backends.retriever = RecordingRetriever(backends.retriever)
    return backends


def calls(backends: Backends) -> dict[str, int]:
    assert isinstance(backends.embedder, HashingEmbedder)
    assert isinstance(backends.retriever, RecordingRetriever)
    assert isinstance(backends.reranker, RecordingReranker)
    assert isinstance(backends.llm, ScriptedLLM)
    return {
        "embedder": len(backends.embedder.batches),
        "retriever": len(backends.retriever.queries),
        "reranker": len(backends.reranker.queries),
        "llm": len(backends.llm.prompts),
    }


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("path", CHAT_PATHS)
async def test_max_tokens_beyond_the_limit_is_400_before_any_backend_is_called(
    client_for: ClientFactory, condense: Settings, path: str, stream: bool
) -> None:
    backends = await recording_backends(condense)
    client = await client_for(backends, condense)
    body = {"messages": TWO_TURNS, "stream": stream, "max_tokens": 2049}
    response = await client.post(path, json=body)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": "invalid_request",
        "message": "max_tokens 2049 is beyond the limit of 2048 (LLM_MAX_TOKENS_LIMIT)",
        "details": [{"field": "max_tokens", "message": "must be at most 2048"}],
    }
    assert calls(backends) == {"embedder": 0, "retriever": 0, "reranker": 0, "llm": 0}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("path", CHAT_PATHS)
async def test_max_tokens_at_the_limit_is_answered(
    client_for: ClientFactory, condense: Settings, path: str, stream: bool
) -> None:
    backends = await recording_backends(condense)
    client = await client_for(backends, condense)
    body = {"messages": TWO_TURNS, "stream": stream, "max_tokens": 2048}
    response = await client.post(path, json=body)
    assert response.status_code == 200
    assert all(count > 0 for count in calls(backends).values())
    assert isinstance(backends.llm, ScriptedLLM)
    assert backends.llm.params[-1].max_tokens == 2048


async def test_the_limit_is_the_setting_and_a_request_without_max_tokens_gets_the_default(
    client_for: ClientFactory, settings: Settings
) -> None:
    tight = settings.model_copy(update={"llm_max_tokens": 16, "llm_max_tokens_limit": 64})
    llm = ScriptedLLM()
    client = await client_for(await make_backends(tight, llm=llm), tight)
    refused = await client.post("/v1/chatqna", json={"messages": "hi", "max_tokens": 65})
    assert refused.status_code == 400
    assert "limit of 64 (LLM_MAX_TOKENS_LIMIT)" in refused.json()["message"]
    for extra in ({"max_tokens": 64}, {}):
        body = {"messages": "hi", "stream": False, **extra}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert [params.max_tokens for params in llm.params] == [64, 16]


async def test_the_schema_s_absolute_bound_is_still_a_422(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.post("/v1/chatqna", json={"messages": "hi", "max_tokens": 32769})
    assert response.status_code == 422
    assert response.json()["details"][0]["field"] == "max_tokens"


def test_the_schema_names_the_setting_and_its_default_not_a_fixed_limit() -> None:
    """An operator may change the limit; the published schema cannot know to what."""
    schema = ChatQnARequest.model_json_schema()["properties"]["max_tokens"]
    default = Settings.model_fields["llm_max_tokens_limit"].default
    assert f"at most LLM_MAX_TOKENS_LIMIT ({default} by default)" in schema["description"]
