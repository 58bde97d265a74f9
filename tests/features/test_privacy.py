"""No secret, and no user text unless the operator opts in, reaches a log record or a span.

Whole requests run with the API key set, against remote clients (TEI embeddings and rerank,
an OpenAI-compatible LLM with its own key) whose transport is a local handler: condense and
blend turns, streamed and not, an ingested document, an upstream that echoes the prompt in
its error body, and a request with a wrong key. Every log record (DEBUG and up, from every
logger, httpx2's included) and every span is then searched for the keys and the user's words.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx2
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.tei import TEIEmbedder, TEIReranker
from chatqna.composition import build_translator
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse

pytestmark = pytest.mark.anyio

API_KEY = "ck-live-4f9a8b7c6d5e"
UPSTREAM_KEY = "sk-upstream-0a1b2c3d4e"
WRONG_KEY = "ck-guess-9z8y7x"
SECRETS = (API_KEY, UPSTREAM_KEY, WRONG_KEY)
# Words only the user (or an uploaded document) wrote; none occurs in the code or the corpus.
USER_WORDS = ("Quokkaville", "zeppelin", "Marzipanhaus", "Fjordwhistle", "Lebkuchen")
HISTORY = [
    {"role": "user", "content": "Wie exportiere ich das Marzipanhaus Archiv mit Lebkuchen?"},
    {"role": "assistant", "content": "The Marzipanhaus export lives in Settings."},
    {"role": "user", "content": "How long does Quokkaville keep my zeppelin archive?"},
]
BEARER = {"Authorization": f"Bearer {API_KEY}"}


class Upstream:
    """TEI and an OpenAI-compatible server in one handler; `failing` makes the LLM echo the
    prompt in a 400 body, as real servers do."""

    def __init__(self) -> None:
        self.failing = False
        self.authorizations: set[str] = set()
        self.hashing = HashingEmbedder()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/embeddings":
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            data = [
                {"index": i, "embedding": self.hashing.vector(t).tolist()}
                for i, t in enumerate(texts)
            ]
            return httpx2.Response(200, json={"data": data})
        if request.url.path == "/rerank":
            return httpx2.Response(
                200, json=[{"index": i, "score": 1.0 / (i + 1)} for i in range(len(body["texts"]))]
            )
        self.authorizations.add(request.headers.get("authorization", ""))
        latest = body["messages"][-1]["content"]
        if self.failing:
            return httpx2.Response(400, json={"error": {"message": f"cannot parse: {latest}"}})
        if body.get("response_format"):  # the condense rewrite
            question = latest.rsplit("Latest message:", 1)[-1].strip()
            return httpx2.Response(200, json=completion(json.dumps({"standalone_query": question})))
        reply = f"About {latest[:40]}: kept 30 days."
        if not body.get("stream"):
            return httpx2.Response(200, json=completion(reply))
        chunks = [{"choices": [{"index": 0, "delta": {"content": reply}}]}]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx2.Response(200, text=text, headers={"content-type": "text/event-stream"})


def completion(content: str) -> dict[str, object]:
    message = {"role": "assistant", "content": content}
    return {"choices": [{"index": 0, "finish_reason": "stop", "message": message}]}


async def remote_client(
    client_for: ClientFactory, settings: Settings, upstream: Upstream
) -> httpx2.AsyncClient:
    transport = httpx2.MockTransport(upstream)
    llm = OpenAIChatLLM(
        "http://llm.test", "m", api_key=UPSTREAM_KEY, backend="llm", transport=transport
    )
    backends = await make_backends(
        settings,
        embedder=TEIEmbedder("http://tei.test", transport=transport),
        reranker=TEIReranker("http://tei.test", transport=transport),
        llm=llm,
    )
    backends.translator = build_translator(settings, llm)
    return await client_for(backends, settings)


def span_text(span: ReadableSpan) -> str:
    parts = [span.name, span.status.description or ""]
    parts += [f"{k}={v}" for k, v in (span.attributes or {}).items()]
    for event in span.events:
        parts.append(event.name)
        parts += [f"{k}={v}" for k, v in (event.attributes or {}).items()]
    parts += [f"{k}={v}" for k, v in span.resource.attributes.items()]
    return "\n".join(parts)


def log_text(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter()
    parts = []
    for record in records:
        parts.append(f"{record.name}: {record.getMessage()}")
        if record.exc_info:
            parts.append(formatter.formatException(record.exc_info))
    return "\n".join(parts)


@pytest.fixture
def captured(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


async def run_every_kind_of_request(client: httpx2.AsyncClient, upstream: Upstream) -> None:
    streamed = await client.post("/v1/chatqna", json={"messages": HISTORY}, headers=BEARER)
    assert streamed.status_code == 200 and parse_sse(streamed.text)[-1][1] == "[DONE]"
    assert "Quokkaville" in streamed.text  # the user's words do flow, just not into logs
    whole = await client.post(
        "/v1/chat/completions", json={"messages": HISTORY, "stream": False}, headers=BEARER
    )
    assert whole.status_code == 200
    document = b"# Fjordwhistle\n\nThe Fjordwhistle archive is kept for 90 days."
    ingested = await client.post(
        "/v1/dataprep/ingest",
        files=[("files", ("archive.md", document, "text/markdown"))],
        headers=BEARER,
    )
    assert ingested.status_code == 200
    upstream.failing = True
    failed = await client.post("/v1/chatqna", json={"messages": HISTORY[-1:]}, headers=BEARER)
    assert parse_sse(failed.text)[-2][0] == "error"
    failed = await client.post(
        "/v1/chatqna", json={"messages": HISTORY, "stream": False}, headers=BEARER
    )
    assert failed.status_code in (502, 503)
    upstream.failing = False
    refused = await client.post(
        "/v1/chatqna",
        json={"messages": HISTORY},
        headers={"Authorization": f"Bearer {WRONG_KEY}"},
    )
    assert refused.status_code == 401


@pytest.mark.parametrize(
    "mode",
    [
        {"multi_turn_mode": "condense"},
        {"multi_turn_blend_enabled": True, "multi_turn_bm25_history_weight": 0.5},
    ],
    ids=["condense", "blend"],
)
async def test_no_secret_and_no_user_text_in_logs_or_spans(
    client_for: ClientFactory,
    settings: Settings,
    spans: InMemorySpanExporter,
    captured: pytest.LogCaptureFixture,
    mode: dict[str, object],
) -> None:
    keyed = settings.model_copy(
        update={
            "chatqna_api_key": SecretStr(API_KEY),
            "openai_api_key": SecretStr(UPSTREAM_KEY),
            **mode,
        }
    )
    upstream = Upstream()
    client = await remote_client(client_for, keyed, upstream)
    await run_every_kind_of_request(client, upstream)

    assert upstream.authorizations == {f"Bearer {UPSTREAM_KEY}"}  # the key was in play
    finished = spans.get_finished_spans()
    assert len(finished) > 20 and len(captured.records) > 10
    traced, logged = "\n".join(map(span_text, finished)), log_text(captured.records)
    for text, where in ((traced, "spans"), (logged, "logs")):
        for secret in SECRETS:
            assert secret not in text, f"a key in the {where}"
        for word in USER_WORDS:
            assert word.lower() not in text.lower(), f"user text {word!r} in the {where}"


async def test_opting_in_puts_the_query_on_spans_but_never_a_key(
    client_for: ClientFactory,
    settings: Settings,
    spans: InMemorySpanExporter,
    captured: pytest.LogCaptureFixture,
) -> None:
    keyed = settings.model_copy(
        update={
            "chatqna_api_key": SecretStr(API_KEY),
            "multi_turn_mode": "condense",
            "chatqna_trace_content": True,
        }
    )
    upstream = Upstream()
    client = await remote_client(client_for, keyed, upstream)
    await run_every_kind_of_request(client, upstream)
    traced = "\n".join(map(span_text, spans.get_finished_spans()))
    assert "Quokkaville" in traced
    assert not any(secret in traced for secret in SECRETS)
    assert "Quokkaville" not in log_text(captured.records)  # the opt-in is for spans only
