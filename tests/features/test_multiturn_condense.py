"""Condense mode through the API against an OpenAI-shaped server: it rewrites or fails closed."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import httpx
import httpx2
import pytest

from chatqna.backends.fakes import (
    HashingEmbedder,
    RecordingReranker,
    RecordingRetriever,
    ScriptedLLM,
)
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.errors import CONDENSE_FAILED_MESSAGE
from chatqna.settings import Settings
from tests.features.conftest import upstream_mock
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse

pytestmark = pytest.mark.anyio

LLM = "http://condense.test"
STANDALONE = "Can I export my data after I cancel my plan?"
CHAT = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings and choose Export."},
    {"role": "user", "content": "Is that possible after I cancel?"},
]


def completion(content: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "c1",
            "object": "chat.completion",
            "model": "rewriter",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
        },
    )


class Probe:
    """The app's recording backends, for asserting who was asked what."""

    def __init__(self) -> None:
        self.embedder = HashingEmbedder()
        self.reranker = RecordingReranker()
        self.answer_llm = ScriptedLLM()
        self.retriever: RecordingRetriever | None = None


@pytest.fixture
def condense_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"multi_turn_mode": "condense"})


async def _client(
    client_for: ClientFactory, settings: Settings, probe: Probe
) -> httpx2.AsyncClient:
    backends = await make_backends(
        settings, embedder=probe.embedder, reranker=probe.reranker, llm=probe.answer_llm
    )
    probe.retriever = RecordingRetriever(backends.retriever)
    backends.retriever = probe.retriever
    backends.condense_llm = OpenAIChatLLM(LLM, "rewriter", backend="condense_llm")
    return await client_for(backends, settings)


async def test_follow_up_searches_and_reranks_with_the_standalone_query(
    client_for: ClientFactory, condense_settings: Settings
) -> None:
    probe = Probe()
    with upstream_mock() as router:
        route = router.post(f"{LLM}/v1/chat/completions").mock(
            return_value=completion(json.dumps({"standalone_query": STANDALONE}))
        )
        client = await _client(client_for, condense_settings, probe)
        response = await client.post("/v1/chatqna", json={"messages": CHAT})
    assert response.status_code == 200
    assert route.call_count == 1
    sent = json.loads(route.calls[0].request.content)
    assert sent["model"] == "rewriter" and sent["temperature"] == 0.0
    assert "Latest message: Is that possible after I cancel?" in sent["messages"][-1]["content"]

    assert probe.embedder.batches == [[STANDALONE]], "dense leg gets the standalone query"
    assert probe.retriever is not None and probe.retriever.queries[0].text == STANDALONE
    assert probe.reranker.queries == [STANDALONE]
    answer_prompt = probe.answer_llm.prompts[-1]
    assert answer_prompt[-1] == {"role": "user", "content": CHAT[-1]["content"]}
    assert answer_prompt[1:] == CHAT, "the answer prompt carries the history and raw message"

    metadata = json.loads(parse_sse(response.text)[0][1])["retrieval"]
    assert metadata["strategy"] == "condense" and metadata["query"] == STANDALONE
    assert metadata["raw_query"] == CHAT[-1]["content"]
    assert metadata["condense"]["status"] == "ok"
    assert metadata["condense"]["standalone_query"] == STANDALONE
    assert metadata["condense"]["history_size"] == 2


async def test_first_turn_makes_no_rewrite_call(
    client_for: ClientFactory, condense_settings: Settings
) -> None:
    probe = Probe()
    with upstream_mock(assert_all_called=False) as router:
        route = router.post(f"{LLM}/v1/chat/completions").mock(return_value=completion("{}"))
        client = await _client(client_for, condense_settings, probe)
        response = await client.post(
            "/v1/chatqna", json={"messages": "How do I export?", "stream": False}
        )
    assert response.status_code == 200 and route.call_count == 0
    condense = response.json()["metadata"]["retrieval"]["condense"]
    assert condense["status"] == "skipped_no_history"
    assert probe.embedder.batches == [["How do I export?"]]


def _timeout(request: httpx.Request) -> httpx.Response:
    raise httpx2.ReadTimeout("slow", request=request)


FAILURES: list[tuple[str, Callable[[httpx.Request], httpx.Response]]] = [
    ("timeout", _timeout),
    ("http_error", lambda request: httpx.Response(500, text="boom")),
    ("http_error", lambda request: httpx.Response(429, text="slow down")),
    ("bad_body", lambda request: httpx.Response(200, text="<html>not json</html>")),
    ("bad_body", lambda request: httpx.Response(200, json={"choices": []})),
    ("bad_body", lambda request: completion("Yes, you can export after cancelling.")),
    ("bad_body", lambda request: completion("Sure, here it is")),
    ("missing_field", lambda request: completion('{"question": "Can I export?"}')),
    ("empty_query", lambda request: completion('{"standalone_query": "  "}')),
]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("reason", "handler"), FAILURES)
async def test_each_failure_is_the_exact_503_and_nothing_is_retrieved(
    client_for: ClientFactory,
    condense_settings: Settings,
    caplog: pytest.LogCaptureFixture,
    reason: str,
    handler: Callable[[httpx.Request], httpx.Response],
    stream: bool,
) -> None:
    caplog.set_level(logging.WARNING)
    probe = Probe()
    with upstream_mock() as router:
        router.post(f"{LLM}/v1/chat/completions").mock(side_effect=handler)
        client = await _client(client_for, condense_settings, probe)
        response = await client.post("/v1/chatqna", json={"messages": CHAT, "stream": stream})
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {
        "error": "condense_failed",
        "reason": reason,
        "message": CONDENSE_FAILED_MESSAGE,
    }
    assert probe.embedder.batches == [], "no embedding after a failed rewrite"
    assert probe.retriever is not None and probe.retriever.queries == []
    assert probe.reranker.queries == [] and probe.answer_llm.prompts == []
    assert any(f"reason={reason}" in r.getMessage() for r in caplog.records)


async def test_blend_flag_is_ignored_in_condense_mode(
    client_for: ClientFactory, settings: Settings
) -> None:
    both = settings.model_copy(
        update={"multi_turn_mode": "condense", "multi_turn_blend_enabled": True}
    )
    probe = Probe()
    with upstream_mock() as router:
        router.post(f"{LLM}/v1/chat/completions").mock(
            return_value=completion(json.dumps({"standalone_query": STANDALONE}))
        )
        client = await _client(client_for, both, probe)
        response = await client.post("/v1/chatqna", json={"messages": CHAT, "stream": False})
    assert response.status_code == 200
    assert probe.embedder.batches == [[STANDALONE]], "no history in the embedding call"
    assert "blend" not in response.json()["metadata"]["retrieval"]


async def test_openai_route_fails_closed_too(
    client_for: ClientFactory, condense_settings: Settings
) -> None:
    probe = Probe()
    with upstream_mock() as router:
        router.post(f"{LLM}/v1/chat/completions").mock(return_value=httpx.Response(502))
        client = await _client(client_for, condense_settings, probe)
        response = await client.post(
            "/v1/chat/completions", json={"messages": CHAT, "stream": True}
        )
    assert response.status_code == 503 and response.json()["reason"] == "http_error"


LONG_QUESTION = (
    "I am on the annual plan, my workspace has about forty members, we use single sign-on "
    "through our identity provider, and our legal team needs every file, comment and audit "
    "log kept for seven years, so before we decide anything I would like to know whether "
    "that export still works for us once the subscription has been cancelled and the "
    "workspace is closed?"
)


@pytest.mark.parametrize(
    "follow_up",
    [
        "I can't find that button, where is it?",
        "No, I meant after I cancel?",
        "Sure, and what about comments?",
        "Is the rewritten invoice included in it?",
        LONG_QUESTION,
    ],
)
async def test_ordinary_follow_ups_pass_the_output_guard(
    client_for: ClientFactory, condense_settings: Settings, follow_up: str
) -> None:
    rewrite = follow_up.rstrip("?") + " when exporting my data?"
    chat = [*CHAT[:2], {"role": "user", "content": follow_up}]
    probe = Probe()
    with upstream_mock() as router:
        route = router.post(f"{LLM}/v1/chat/completions").mock(
            return_value=completion(json.dumps({"standalone_query": rewrite}))
        )
        client = await _client(client_for, condense_settings, probe)
        response = await client.post("/v1/chatqna", json={"messages": chat, "stream": False})
    assert response.status_code == 200, response.text
    assert response.json()["metadata"]["retrieval"]["query"] == rewrite
    sent = json.loads(route.calls[0].request.content)
    assert sent["max_tokens"] >= len(follow_up) // 2
