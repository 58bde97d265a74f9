"""`/v1/chatqna` and `/v1/chat/completions`: the stream contract, validation and upstream errors."""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest

from chatqna.app import create_app
from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import HashingEmbedder, RecordingReranker, ScriptedLLM
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.tei import TEIEmbedder
from chatqna.errors import UpstreamError
from chatqna.retrieval.remote import RemoteRetriever
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse
from tests.unit.backends.test_openai_chat import CONTEXT_ERRORS
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

TWO_TURNS = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings and choose Export."},
    {"role": "user", "content": "How long is data kept after cancellation?"},
]


async def test_stream_sends_metadata_then_tokens_then_done(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.post("/v1/chatqna", json={"messages": TWO_TURNS})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert events[0][0] == "metadata"
    metadata = json.loads(events[0][1])
    docs = metadata["source_documents"]
    assert docs and docs[0]["source"] == "retention.md"
    assert {"id", "text", "title", "source", "score", "scores"} <= set(docs[0])
    assert metadata["retrieval"]["query"] == TWO_TURNS[-1]["content"]
    assert metadata["retrieval"]["k"] == 4
    assert events[-1] == ("message", "[DONE]")
    chunks = [json.loads(data) for name, data in events[1:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.strip() == "This is the answer."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_non_stream_returns_completion_with_metadata(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.post("/v1/chatqna", json={"messages": TWO_TURNS, "stream": False})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "This is the answer."
    assert body["metadata"]["source_documents"][0]["source"] == "retention.md"
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 4


async def test_string_messages_and_request_knobs(
    client_for: ClientFactory, settings: Settings
) -> None:
    llm = ScriptedLLM()
    reranker = RecordingReranker()
    client = await client_for(await make_backends(settings, llm=llm, reranker=reranker))
    response = await client.post(
        "/v1/chatqna",
        json={
            "messages": "annual refund",
            "stream": False,
            "k": 2,
            "top_n": 1,
            "temperature": 0,
            "max_tokens": 17,
            "top_k": 5,
        },
    )
    assert response.status_code == 200
    assert len(response.json()["metadata"]["source_documents"]) == 1
    params = llm.params[-1]
    assert params.temperature == 0.0 and params.max_tokens == 17 and params.top_k == 5
    assert reranker.queries == ["annual refund"]


async def test_answer_prompt_carries_history_and_raw_question(
    client_for: ClientFactory, settings: Settings
) -> None:
    llm = ScriptedLLM()
    client = await client_for(await make_backends(settings, llm=llm))
    await client.post("/v1/chatqna", json={"messages": TWO_TURNS, "stream": False})
    prompt = llm.prompts[-1]
    assert prompt[0]["role"] == "system" and "retention.md" in prompt[0]["content"]
    assert prompt[1:] == TWO_TURNS


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"messages": []}, 422, "invalid_request"),
        ({"messages": ""}, 422, "invalid_request"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 422, "invalid_request"),
        ({"messages": [{"role": "user", "content": "  "}]}, 422, "invalid_request"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, 422, "invalid_request"),
        ({"messages": "hi", "k": 0}, 422, "invalid_request"),
        ({"messages": "hi", "temperature": -1}, 422, "invalid_request"),
        ({}, 422, "invalid_request"),
        # Numbers no LLM server's integer can hold (they could not even be sent on).
        ({"messages": "hi", "seed": 2**64}, 422, "invalid_request"),
        ({"messages": "hi", "seed": -(2**63) - 1}, 422, "invalid_request"),
        ({"messages": "hi", "top_k": 2**64}, 422, "invalid_request"),
    ],
)
async def test_bad_requests_get_the_envelope(
    client_for: ClientFactory, body: dict[str, object], status: int, code: str
) -> None:
    client = await client_for()
    response = await client.post("/v1/chatqna", json=body)
    assert response.status_code == status
    envelope = response.json()
    assert envelope["error"] == code
    assert envelope["message"]
    assert isinstance(envelope["details"], list) and envelope["details"]


async def test_malformed_json_is_400(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.post(
        "/v1/chatqna", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_json"


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": "caf\xe9"}',  # not UTF-8
        b'{"messages": "hi", "seed": ' + b"9" * 5000 + b"}",  # too long to convert
        b"[" * 100_000 + b"]" * 100_000,  # too deep to decode
    ],
)
async def test_a_body_json_cannot_decode_is_400_invalid_json(
    client_for: ClientFactory, body: bytes
) -> None:
    client = await client_for()
    response = await client.post(
        "/v1/chatqna", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": "invalid_json",
        "message": "The request body is not valid JSON.",
    }


# A lone surrogate, escaped in JSON: no UTF-8 text can hold it.
LONE = "\\ud800"


@pytest.mark.parametrize(
    "body",
    [
        '{"messages": "hi LONE there"}',
        '{"messages": [{"role": "user", "content": "hi LONE"}]}',
        '{"messages": [{"role": "system", "content": "LONE"}, {"role": "user", "content": "hi"}]}',
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "LONE"}]}]}',
        '{"messages": "hi", "stop": "LONE"}',
        '{"messages": "hi", "stop": ["x", "LONE"]}',
    ],
)
@pytest.mark.parametrize("path", ["/v1/chatqna", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [True, False])
async def test_text_that_is_not_valid_unicode_is_422(
    client_for: ClientFactory, body: str, path: str, stream: bool
) -> None:
    client = await client_for()
    payload = json.loads(body.replace("LONE", LONE))
    payload["stream"] = stream
    response = await client.post(
        path,
        content=json.dumps(payload).encode(),  # json.dumps escapes the surrogate
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"


async def test_a_stream_that_fails_to_open_still_ends_with_an_error_event(
    client_for: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await client_for()

    def broken(record: object) -> None:
        raise RuntimeError("cannot describe the turn")

    monkeypatch.setattr("chatqna.api.chat.TurnMetadata.of", broken)
    response = await client.post("/v1/chatqna", json={"messages": "hi"})
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert events[0][0] == "error" and json.loads(events[0][1])["error"] == "internal_error"
    assert events[-1] == ("message", "[DONE]")


async def test_oversized_message_is_413(client_for: ClientFactory, settings: Settings) -> None:
    small = settings.model_copy(update={"chatqna_max_message_chars": 50})
    client = await client_for(await make_backends(small), small)
    response = await client.post("/v1/chatqna", json={"messages": "x" * 51})
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert "CHATQNA_MAX_MESSAGE_CHARS" in response.json()["message"]
    assert (await client.post("/v1/chatqna", json={"messages": "x" * 50})).status_code == 200


async def test_a_long_answer_sent_back_as_history_is_shortened_not_refused(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_max_message_chars": 50})
    llm = ScriptedLLM()
    client = await client_for(await make_backends(small, llm=llm), small)
    chat = [
        {"role": "user", "content": "How do I export?"},
        {"role": "assistant", "content": "Open Settings and choose Export. " * 10},
        {"role": "user", "content": "After I cancel?"},
    ]
    response = await client.post("/v1/chatqna", json={"messages": chat, "stream": False})
    assert response.status_code == 200
    answer = llm.prompts[-1][-2]
    assert answer["role"] == "assistant" and len(answer["content"]) <= 50
    assert answer["content"].startswith("Open Settings and choose Export.")
    for role in ("user", "system"):
        too_long = [{"role": role, "content": "x " * 30}, chat[-1]]
        response = await client.post("/v1/chatqna", json={"messages": too_long})
        assert response.status_code == 413, role


async def test_too_many_messages_is_413(client_for: ClientFactory, settings: Settings) -> None:
    small = settings.model_copy(update={"chatqna_max_messages": 2})
    client = await client_for(await make_backends(small), small)
    response = await client.post("/v1/chatqna", json={"messages": TWO_TURNS})
    assert response.status_code == 413


def _tei(handler: object) -> TEIEmbedder:
    return TEIEmbedder("http://tei.test", transport=httpx2.MockTransport(handler))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("handler", "status", "code"),
    [
        (lambda request: httpx2.Response(500, text="boom"), 502, "upstream_error"),
        (lambda request: httpx2.Response(200, text="not json"), 502, "bad_upstream_response"),
        (lambda request: httpx2.Response(200, json={"data": []}), 502, "bad_upstream_response"),
    ],
)
async def test_embedder_failures_are_typed_5xx(
    client_for: ClientFactory, settings: Settings, handler: object, status: int, code: str
) -> None:
    client = await client_for(await make_backends(settings, embedder=_tei(handler)))
    for stream in (True, False):
        response = await client.post("/v1/chatqna", json={"messages": "hi", "stream": stream})
        assert response.status_code == status
        assert response.json()["error"] == code
        assert response.json()["backend"] == "embedder"


@pytest.mark.parametrize(
    "metadata",
    [{"chunk_index": "x"}, {"chunk_index": [1]}, {"source": 7}, {"scores": {"dense": "high"}}],
    ids=["chunk_index-string", "chunk_index-list", "source-number", "score-string"],
)
async def test_a_malformed_retriever_reply_is_a_typed_502(
    client_for: ClientFactory, metadata: dict[str, object]
) -> None:
    doc = {"id": "c1", "text": "Refunds take 5 days.", "score": 0.5, "metadata": metadata}
    reply = httpx2.Response(200, json={"retrieved_docs": [doc]})
    retriever = RemoteRetriever(
        "http://retriever.test", transport=httpx2.MockTransport(lambda request: reply)
    )
    llm = ScriptedLLM()
    backends = Backends(HashingEmbedder(), retriever, RecordingReranker(), llm, llm)
    client = await client_for(backends)
    for stream in (True, False):
        response = await client.post("/v1/chatqna", json={"messages": "hi", "stream": stream})
        assert response.status_code == 502
        assert response.json()["error"] == "bad_upstream_response"
        assert response.json()["backend"] == "retriever"


async def test_embedder_timeout_is_504(client_for: ClientFactory, settings: Settings) -> None:
    def slow(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("too slow", request=request)

    client = await client_for(await make_backends(settings, embedder=_tei(slow)))
    response = await client.post("/v1/chatqna", json={"messages": "hi"})
    assert response.status_code == 504
    assert response.json()["error"] == "upstream_timeout"


def _llm(handler: object) -> OpenAIChatLLM:
    return OpenAIChatLLM("http://llm.test/v1", "m", transport=httpx2.MockTransport(handler))  # type: ignore[arg-type]


async def test_llm_error_before_stream_is_5xx_for_non_stream(
    client_for: ClientFactory, settings: Settings
) -> None:
    llm = _llm(lambda request: httpx2.Response(503, text="overloaded"))
    client = await client_for(await make_backends(settings, llm=llm))
    response = await client.post("/v1/chatqna", json={"messages": "hi", "stream": False})
    assert response.status_code == 502
    assert response.json() == {
        "error": "upstream_error",
        "message": "llm: POST /v1/chat/completions returned HTTP 503",
        "backend": "llm",
    }


LLAMA_CPP_CONTEXT_ERROR = CONTEXT_ERRORS["llama.cpp"][1]  # as llama.cpp's server sends it


async def test_a_prompt_beyond_the_llm_context_is_413_or_an_error_event(
    client_for: ClientFactory, settings: Settings
) -> None:
    llm = _llm(lambda request: httpx2.Response(400, json=LLAMA_CPP_CONTEXT_ERROR))
    client = await client_for(await make_backends(settings, llm=llm))
    response = await client.post("/v1/chatqna", json={"messages": "hi", "stream": False})
    assert response.status_code == 413
    assert response.json()["error"] == "context_too_long"
    assert "5210 prompt tokens, a context of 4096" in response.json()["message"]
    # Streamed, the sources are already out when the LLM refuses: an error event ends it.
    streamed = await client.post("/v1/chatqna", json={"messages": "hi"})
    events = parse_sse(streamed.text)
    assert events[0][0] == "metadata" and events[-2][0] == "error"
    assert json.loads(events[-2][1])["error"] == "context_too_long"


async def test_llm_failure_after_stream_start_is_error_event(
    client_for: ClientFactory, settings: Settings
) -> None:
    llm = ScriptedLLM("one two three", fail_after=2, error=UpstreamError("cut", backend="llm"))
    client = await client_for(await make_backends(settings, llm=llm))
    response = await client.post("/v1/chatqna", json={"messages": "hi"})
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert events[0][0] == "metadata"
    assert events[-2][0] == "error"
    assert json.loads(events[-2][1])["error"] == "upstream_error"
    assert events[-1] == ("message", "[DONE]")
    tokens = [json.loads(d)["choices"][0]["delta"].get("content") for n, d in events[1:-2]]
    assert "".join(t or "" for t in tokens) == "one two"


async def test_truncated_upstream_stream_becomes_error_event(
    client_for: ClientFactory, settings: Settings
) -> None:
    def truncated(request: httpx2.Request) -> httpx2.Response:
        chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
        return httpx2.Response(
            200,
            text=f"data: {json.dumps(chunk)}\n\n",
            headers={"content-type": "text/event-stream"},
        )

    client = await client_for(await make_backends(settings, llm=_llm(truncated)))
    events = parse_sse((await client.post("/v1/chatqna", json={"messages": "hi"})).text)
    assert [name for name, _ in events][-2:] == ["error", "message"]
    assert "before [DONE]" in json.loads(events[-2][1])["message"]


async def test_openai_route_streams_without_metadata_event(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.post(
        "/v1/chat/completions", json={"messages": TWO_TURNS, "stream": True}
    )
    events = parse_sse(response.text)
    assert all(name == "message" for name, _ in events)
    first = json.loads(events[0][1])
    assert first["metadata"]["source_documents"]
    non_stream = await client.post("/v1/chat/completions", json={"messages": TWO_TURNS})
    assert non_stream.json()["object"] == "chat.completion"


async def test_unknown_path_gets_envelope(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


async def test_models_lists_the_llm(client_for: ClientFactory, settings: Settings) -> None:
    client = await client_for(await make_backends(settings, llm=ScriptedLLM(model="m-1")))
    assert (await client.get("/v1/models")).json()["data"][0]["id"] == "m-1"


async def test_hashing_embedder_sees_only_the_query(
    client_for: ClientFactory, settings: Settings
) -> None:
    embedder = HashingEmbedder()
    client = await client_for(await make_backends(settings, embedder=embedder))
    await client.post("/v1/chatqna", json={"messages": TWO_TURNS, "stream": False})
    assert embedder.batches == [[TWO_TURNS[-1]["content"]]]


async def test_pieces_that_arrive_together_are_still_one_chunk_each(
    client_for: ClientFactory, settings: Settings
) -> None:
    def together(request: httpx2.Request) -> httpx2.Response:
        frames = "".join(
            "data: "
            + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            + "\n\n"
            for delta, finish in (
                ({"content": "Re"}, None),
                ({"content": "funds"}, None),
                ({"content": " close."}, None),
                ({}, "stop"),
            )
        )
        return httpx2.Response(200, text=frames + "data: [DONE]\n\n")  # one read

    client = await client_for(await make_backends(settings, llm=_llm(together)))
    events = parse_sse((await client.post("/v1/chatqna", json={"messages": "hi"})).text)
    chunks = [json.loads(data) for name, data in events[1:-1]]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert contents == ["", "Re", "funds", " close.", None]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len({c["id"] for c in chunks}) == 1


class Stalled:
    """An embedder or LLM whose call waits until cancelled, and says when it was."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.waiting = asyncio.Event()
        self.cancelled = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def _stall(self) -> None:
        self.waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def embed(self, texts: object) -> object:
        await self._stall()
        raise AssertionError("unreachable")

    async def complete(self, messages: object, params: object) -> object:
        await self._stall()
        raise AssertionError("unreachable")


async def _leave_while_waiting(
    settings: Settings, backends: Backends, stalled: Stalled, body: dict[str, object]
) -> list[dict[str, object]]:
    """Send `body` as raw ASGI, disconnect once `stalled` waits; what the app sent back."""
    app = create_app(settings, backends, tracer_provider=TRACER_PROVIDER)
    gone = asyncio.Event()
    payload = json.dumps(body).encode()
    sent: list[dict[str, object]] = []
    messages = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict[str, object]:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"host", b"localhost:8888")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8888),
        "state": {},
    }
    async with app.router.lifespan_context(app):
        call = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.wait_for(stalled.waiting.wait(), 10)
        gone.set()
        await asyncio.wait_for(call, 10)
        await asyncio.wait_for(stalled.cancelled.wait(), 1)
    return sent


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_gone_while_its_turn_is_prepared_stops_the_turn(
    settings: Settings, stream: bool
) -> None:
    stalled = Stalled(HashingEmbedder())
    backends = await make_backends(settings, embedder=stalled)  # type: ignore[arg-type]
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
    sent = await _leave_while_waiting(settings, backends, stalled, body)
    assert sent[0]["status"] == 499  # for logs and metrics: nobody is there to read it


async def test_a_client_gone_before_its_completion_is_done_stops_the_llm(
    settings: Settings,
) -> None:
    stalled = Stalled(ScriptedLLM())
    backends = await make_backends(settings, llm=stalled)  # type: ignore[arg-type]
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": False}
    sent = await _leave_while_waiting(settings, backends, stalled, body)
    assert sent[0]["status"] == 499
