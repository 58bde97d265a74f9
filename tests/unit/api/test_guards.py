"""Request limits: chats in flight (429), body size (413), a chat's body read before its
slot (408 when it is late), refusals before a body closing the connection, a disconnect
freeing its slot, and a JSON endpoint's body sent as another type (415). Uploads' admission
is tested in `test_ingest_admission`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from chatqna.api.guards import is_json_media_type, route_path
from chatqna.app import create_app
from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.protocols import Delta, GenerationParams
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

ASK = {"messages": "How do I export my data?"}


class GatedLLM(ScriptedLLM):
    """Streams a token, then waits for `release` before finishing; counts open streams."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.open_streams = 0

    async def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        self.open_streams += 1
        try:
            yield Delta(text="held ")
            self.started.set()
            await self.release.wait()
            yield Delta(finish_reason="stop")
        finally:
            self.open_streams -= 1


async def gated_client(
    client_for: ClientFactory, settings: Settings, **limits: Any
) -> tuple[httpx2.AsyncClient, GatedLLM]:
    limited = settings.model_copy(update=limits)
    llm = GatedLLM()
    return await client_for(await make_backends(limited, llm=llm), limited), llm


# --------------------------------------------------------------------------- concurrency


async def test_a_saturated_service_answers_429_with_retry_after(
    client_for: ClientFactory, settings: Settings
) -> None:
    client, llm = await gated_client(
        client_for, settings, chatqna_max_concurrent_chats=1, chatqna_queue_timeout_seconds=0
    )
    first = asyncio.create_task(client.post("/v1/chatqna", json=ASK))
    await llm.started.wait()  # the first chat holds the only slot, mid-stream
    for path in ("/v1/chatqna", "/v1/chat/completions"):
        refused = await client.post(path, json=ASK)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "connection" not in refused.headers  # its body was read: the connection is good
        assert refused.json() == {
            "error": "too_many_requests",
            "message": "The service is answering 1 chats already "
            "(CHATQNA_MAX_CONCURRENT_CHATS); retry shortly.",
        }
    # Only chats count: health, readiness and dataprep still answer.
    assert (await client.get("/v1/health_check")).status_code == 200
    assert (await client.post("/v1/dataprep/get")).status_code == 200
    llm.release.set()
    assert (await first).status_code == 200
    assert (await client.post("/v1/chatqna", json=ASK)).status_code == 200


async def test_a_chat_waits_for_a_slot_within_the_queue_timeout(
    client_for: ClientFactory, settings: Settings
) -> None:
    client, llm = await gated_client(
        client_for, settings, chatqna_max_concurrent_chats=1, chatqna_queue_timeout_seconds=30
    )
    first = asyncio.create_task(client.post("/v1/chatqna", json=ASK))
    await llm.started.wait()
    second = asyncio.create_task(client.post("/v1/chatqna", json=ASK))
    await asyncio.sleep(0.01)
    assert not second.done()  # queued, not refused
    llm.release.set()
    assert (await first).status_code == 200
    assert (await second).status_code == 200


async def test_a_queued_chat_is_refused_when_no_slot_frees_in_time(
    client_for: ClientFactory, settings: Settings
) -> None:
    client, llm = await gated_client(
        client_for, settings, chatqna_max_concurrent_chats=1, chatqna_queue_timeout_seconds=0.01
    )
    first = asyncio.create_task(client.post("/v1/chatqna", json=ASK))
    await llm.started.wait()
    assert (await client.post("/v1/chatqna", json=ASK)).status_code == 429
    llm.release.set()
    await first


async def test_failed_chats_give_their_slot_back(
    client_for: ClientFactory, settings: Settings
) -> None:
    limited = settings.model_copy(update={"chatqna_max_concurrent_chats": 1})
    llm = ScriptedLLM(fail_after=1, error=RuntimeError("boom"))
    client = await client_for(await make_backends(limited, llm=llm), limited)
    for _ in range(3):
        response = await client.post("/v1/chatqna", json=ASK)
        assert response.status_code == 200
        assert parse_sse(response.text)[-2][0] == "error"
    invalid = await client.post("/v1/chatqna", json={"messages": []})
    assert invalid.status_code in (400, 422)
    assert (await client.post("/v1/chatqna", json=ASK)).status_code == 200


async def test_a_refusal_before_a_declared_body_closes_the_connection(
    client_for: ClientFactory, settings: Settings
) -> None:
    keyed = settings.model_copy(update={"chatqna_api_key": SecretStr("k")})
    client = await client_for(settings_=keyed)
    with_body = await client.post("/v1/chatqna", json=ASK)
    assert with_body.status_code == 401
    assert with_body.headers["connection"] == "close"
    without_body = await client.get("/v1/dataprep/get")
    assert without_body.status_code == 401
    assert "connection" not in without_body.headers


# --------------------------------------------------------------------------- body size


async def test_a_body_over_the_limit_is_413_before_parsing(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_max_request_bytes": 1024})
    client = await client_for(settings_=small)
    response = await client.post("/v1/chatqna", json={"messages": "x" * 2000})
    assert response.status_code == 413
    assert response.headers["connection"] == "close"  # its body is left unread
    assert response.json() == {
        "error": "payload_too_large",
        "message": "The request body is larger than 1024 bytes (CHATQNA_MAX_REQUEST_BYTES).",
    }
    assert (await client.post("/v1/chatqna", json={"messages": "x" * 900})).status_code == 200


@pytest.mark.parametrize("role", ["megaservice", "retriever"])
async def test_every_operation_declares_the_413_it_answers_a_body_over_the_limit_with(
    client_for: ClientFactory, settings: Settings, role: str
) -> None:
    small = settings.model_copy(update={"chatqna_max_request_bytes": 1024})
    client = await client_for(settings_=small, role=role)
    document = (await client.get("/openapi.json")).json()
    operations = [(m, p, op) for p, ops in document["paths"].items() for m, op in ops.items()]
    assert len(operations) >= 6
    headers = {"content-type": "application/json"}
    for method, path, operation in operations:
        response = await client.request(method, path, content=b"x" * 2000, headers=headers)
        assert response.status_code == 413, (method, path)
        assert response.json()["error"] == "payload_too_large"
        assert "413" in operation["responses"], (method, path)


@pytest.mark.parametrize("role", ["megaservice", "retriever"])
async def test_every_write_declares_the_403_another_site_s_page_gets(
    client_for: ClientFactory, role: str
) -> None:
    client = await client_for(role=role)
    document = (await client.get("/openapi.json")).json()
    writes = [(m, p, op) for p, ops in document["paths"].items() for m, op in ops.items()]
    writes = [(m, p, op) for m, p, op in writes if m not in ("get", "head", "options")]
    assert len(writes) >= 3
    headers = {"content-type": "application/json", "sec-fetch-site": "cross-site"}
    for method, path, operation in writes:
        response = await client.request(method, path, content=b"{}", headers=headers)
        assert response.status_code == 403, (method, path)
        assert response.json()["error"] == "cross_site_request"
        assert "403" in operation["responses"], (method, path)


async def test_a_chunked_body_is_counted_as_it_arrives(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_max_request_bytes": 1024})
    client = await client_for(settings_=small)
    payload = json.dumps({"messages": "x" * 3000}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 500):
            yield payload[start : start + 500]

    response = await client.post(
        "/v1/chatqna", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert "CHATQNA_MAX_REQUEST_BYTES" in response.json()["message"]


async def test_uploads_have_their_own_limit_on_the_whole_body(
    client_for: ClientFactory, settings: Settings
) -> None:
    limits = {"chatqna_max_request_bytes": 1024, "chatqna_max_upload_request_bytes": 6000}
    client = await client_for(settings_=settings.model_copy(update=limits))
    text = ("Invoices are sent by email on the first day of the month. " * 40).encode()
    before = [entry["name"] for entry in (await client.post("/v1/dataprep/get")).json()]
    one = [("files", ("invoices.md", text, "text/markdown"))]
    response = await client.post("/v1/dataprep/ingest", files=one)
    assert 1024 < len(text) < 6000
    assert response.status_code == 200, response.text
    # Three such files are over the upload limit together: refused, nothing ingested.
    three = [("files", (f"invoices-{n}.md", text, "text/markdown")) for n in range(3)]
    response = await client.post("/v1/dataprep/ingest", files=three)
    assert response.status_code == 413
    assert "CHATQNA_MAX_UPLOAD_REQUEST_BYTES" in response.json()["message"]
    listed = await client.post("/v1/dataprep/get")
    assert sorted(entry["name"] for entry in listed.json()) == sorted([*before, "invoices.md"])


async def test_an_upload_s_media_type_is_matched_whatever_its_case(
    client_for: ClientFactory, settings: Settings
) -> None:
    # Starlette parses `Multipart/Form-Data` as the upload it is: it gets the upload limit.
    limits = {"chatqna_max_request_bytes": 1024, "chatqna_max_upload_request_bytes": 6000}
    client = await client_for(settings_=settings.model_copy(update=limits))
    text = ("Invoices are sent by email on the first day of the month. " * 40).encode()
    request = client.build_request(
        "POST", "/v1/dataprep/ingest", files=[("files", ("cased.md", text, "text/markdown"))]
    )
    kind, boundary = request.headers["content-type"].split(";", 1)
    response = await client.post(
        "/v1/dataprep/ingest",
        content=request.read(),
        headers={"content-type": kind.title() + ";" + boundary},
    )
    assert response.status_code == 200, response.text
    assert [f["name"] for f in response.json()["files"]] == ["cased.md"]


async def test_a_chunked_upload_stops_at_the_upload_limit(
    client_for: ClientFactory, settings: Settings
) -> None:
    limits = {"chatqna_max_upload_request_bytes": 4096}
    client = await client_for(settings_=settings.model_copy(update=limits))
    request = client.build_request(
        "POST",
        "/v1/dataprep/ingest",
        files=[("files", ("big.md", b"x" * 20_000, "text/markdown"))],
    )
    body = request.read()
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1000):
            sent.append(start)
            yield body[start : start + 1000]

    response = await client.post(
        "/v1/dataprep/ingest",
        content=chunks(),
        headers={"content-type": request.headers["content-type"]},
    )
    assert response.status_code == 413
    assert "CHATQNA_MAX_UPLOAD_REQUEST_BYTES" in response.json()["message"]


async def test_multipart_elsewhere_is_held_to_the_request_limit(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_max_request_bytes": 1024})
    client = await client_for(settings_=small)
    for content_type in ("multipart/form-data; boundary=x", "multipart/x"):
        response = await client.post(
            "/v1/dataprep/delete", content=b"x" * 5000, headers={"content-type": content_type}
        )
        assert response.status_code == 413
        assert "CHATQNA_MAX_REQUEST_BYTES" in response.json()["message"]


# --------------------------------------------------------------------------- disconnects


class EndlessLLM(ScriptedLLM):
    """Streams tokens until closed; records that its stream was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self.closed = False

    async def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        try:
            while True:
                yield Delta(text="again ")
                self.sent += 1
                await asyncio.sleep(0.001)
        finally:
            self.closed = True


def chat_scope(spec_version: str) -> dict[str, Any]:
    """The ASGI scope of a `POST /v1/chatqna` from a server of this ASGI spec version."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec_version},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chatqna",
        "raw_path": b"/v1/chatqna",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"localhost:8888")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8888),
    }


def body_messages(body: bytes, pieces: int) -> list[dict[str, Any]]:
    """`body` as `pieces` ASGI `http.request` messages, the last without `more_body`."""
    size = -(-len(body) // pieces)
    parts = [body[start : start + size] for start in range(0, len(body), size)]
    return [
        {"type": "http.request", "body": part, "more_body": n < len(parts) - 1}
        for n, part in enumerate(parts)
    ]


@pytest.mark.parametrize("pieces", [1, 3])
@pytest.mark.parametrize("cancel_lands_in", ["generator", "send"])
async def test_a_disconnect_closes_the_llm_stream_and_frees_the_slot(
    settings: Settings, cancel_lands_in: str, pieces: int
) -> None:
    """Driven at the ASGI level: httpx2's test transport cannot disconnect mid-response.

    The disconnect cancels the response either while the answer's generators await the
    LLM, or while a send is in progress (the generators then wait at a `yield`). It is
    heard after the body the guard read first, whether that came whole or in pieces.
    """
    limited = settings.model_copy(update={"chatqna_max_concurrent_chats": 1})
    llm = EndlessLLM()
    app = create_app(limited, await make_backends(limited, llm=llm), TRACER_PROVIDER)
    gone = asyncio.Event()
    body = json.dumps(ASK).encode()
    sent: list[dict[str, Any]] = []
    requests = body_messages(body, pieces)

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if b"again" in message.get("body", b"") and llm.sent >= 3 and not gone.is_set():
            gone.set()
            if cancel_lands_in == "send":
                await asyncio.sleep(1)  # the socket is slow: the cancellation lands here

    scope = chat_scope("2.3")
    async with app.router.lifespan_context(app):
        await asyncio.wait_for(app(scope, receive, send), timeout=10)
        assert sent[0]["status"] == 200
        assert llm.closed, "the LLM stream was left open after the client went away"
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://localhost:8888"
        ) as client:
            # The slot came back: with a limit of 1, a new chat is admitted.
            answer = await client.post("/v1/chatqna", json=ASK | {"stream": False})
            assert answer.status_code == 200


async def test_a_client_gone_before_the_first_send_still_ends_the_turns_span(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    """An ASGI 2.4 server raises `OSError` from the first `send` of a response whose client
    has gone: the answer's generator never starts, and the turn's span is ended anyway."""
    app = create_app(settings, await make_backends(settings), TRACER_PROVIDER)
    body = json.dumps(ASK).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client is gone")

    scope = chat_scope("2.4")
    async with app.router.lifespan_context(app):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app(scope, receive, send), timeout=10)
    ended = [s.name for s in spans.get_finished_spans()]
    assert "chatqna.orchestrate" in ended, ended


# --------------------------------------------------------------------------- root path


@pytest.mark.parametrize(
    ("path", "root", "routed"),
    [
        ("/chat/v1/chatqna", "/chat", "/v1/chatqna"),
        ("/chat", "/chat", "/"),
        ("/v1/chatqna", "", "/v1/chatqna"),
        ("/v1/chatqna", "/chat", "/v1/chatqna"),  # a server that leaves the prefix out
        ("/chatter/v1/ready", "/chat", "/chatter/v1/ready"),  # not under the prefix
    ],
)
def test_the_route_path_drops_the_root_path(path: str, root: str, routed: str) -> None:
    assert route_path({"path": path, "root_path": root}) == routed


def mounted_at(app: ASGIApp, root: str) -> ASGIApp:
    """`app` as uvicorn serves it with `root_path=root`: the prefix in both `root_path` and
    `path`, as behind a proxy that strips it."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = root.encode() + scope["raw_path"]
            scope = {**scope, "root_path": root, "path": root + scope["path"], "raw_path": raw}
        await app(scope, receive, send)

    return asgi


async def test_the_guards_hold_under_a_root_path(settings: Settings) -> None:
    limited = settings.model_copy(
        update={
            "chatqna_api_key": SecretStr("s3cret"),
            "chatqna_root_path": "/chat",
            "chatqna_max_concurrent_chats": 1,
            "chatqna_queue_timeout_seconds": 0,
            "chatqna_max_request_bytes": 1024,
            "chatqna_max_upload_request_bytes": 6000,
            "chatqna_api_docs": True,
        }
    )
    llm = GatedLLM()
    app = create_app(limited, await make_backends(limited, llm=llm), TRACER_PROVIDER)
    key = {"authorization": "Bearer s3cret"}
    transport = httpx2.ASGITransport(app=mounted_at(app, "/chat"))
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=transport, base_url="http://localhost:8888") as client,
    ):
        # The probes stay open without the key; everything else needs it.
        assert (await client.get("/v1/health_check")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 401
        # An upload has the upload limit, not the 1 KiB limit of other bodies.
        text = ("Invoices are sent by email on the first day of the month. " * 40).encode()
        files = [("files", ("invoices.md", text, "text/markdown"))]
        uploaded = await client.post("/v1/dataprep/ingest", files=files, headers=key)
        assert uploaded.status_code == 200, uploaded.text
        # /docs loads the schema from under the prefix.
        assert "/chat/openapi.json" in (await client.get("/docs", headers=key)).text
        # One chat at a time.
        first = asyncio.create_task(client.post("/v1/chatqna", json=ASK, headers=key))
        await llm.started.wait()
        refused = await client.post("/v1/chatqna", json=ASK, headers=key)
        assert refused.status_code == 429
        llm.release.set()
        assert (await first).status_code == 200


# --------------------------------------------------------------------------- body first


@contextlib.asynccontextmanager
async def running(
    settings: Settings, llm: ScriptedLLM | None = None
) -> AsyncIterator[tuple[FastAPI, httpx2.AsyncClient]]:
    """The started app, to drive at the ASGI level, and a client on it."""
    app = create_app(settings, await make_backends(settings, llm=llm), TRACER_PROVIDER)
    transport = httpx2.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=transport, base_url="http://localhost:8888") as client,
    ):
        yield app, client


class HeldBody:
    """A client that sends the first `sent` bytes of a body and then nothing, until it
    `leave`s; counts what it has been asked for."""

    def __init__(self, sent: bytes = b"{") -> None:
        self.first = {"type": "http.request", "body": sent, "more_body": True}
        self.gone = asyncio.Event()
        self.reads = 0
        self.answer: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.reads == 1:
            return self.first
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.answer.append(message)


async def test_a_chat_whose_body_is_held_back_takes_no_slot(settings: Settings) -> None:
    limited = settings.model_copy(
        update={"chatqna_max_concurrent_chats": 1, "chatqna_queue_timeout_seconds": 0}
    )
    held = HeldBody()
    async with running(limited) as (app, client):
        stuck = asyncio.create_task(app(chat_scope("2.3"), held.receive, held.send))
        while held.reads < 2:  # the guard waits for the rest of the body
            await asyncio.sleep(0)
        # With one slot, a complete chat is still answered beside the stuck one.
        for _ in range(2):
            answer = await client.post("/v1/chatqna", json=ASK | {"stream": False})
            assert answer.status_code == 200
        held.gone.set()  # the client leaves before its body is complete: nobody to answer
        await asyncio.wait_for(stuck, timeout=10)
        assert held.answer == []
        assert (await client.post("/v1/chatqna", json=ASK)).status_code == 200


async def test_a_body_not_complete_by_the_deadline_is_408_and_closes(
    settings: Settings,
) -> None:
    limited = settings.model_copy(
        update={"chatqna_max_concurrent_chats": 1, "chatqna_body_timeout_seconds": 0.05}
    )
    held = HeldBody()
    async with running(limited) as (app, client):
        await asyncio.wait_for(app(chat_scope("2.3"), held.receive, held.send), timeout=10)
        start, body = held.answer[0], held.answer[1]
        assert start["status"] == 408
        assert (b"connection", b"close") in start["headers"]
        assert json.loads(body["body"]) == {
            "error": "request_timeout",
            "message": "The request body did not arrive within 0.05 seconds "
            "(CHATQNA_BODY_TIMEOUT_SECONDS).",
        }
        held.gone.set()
        assert (await client.post("/v1/chatqna", json=ASK)).status_code == 200


async def test_a_chat_body_in_many_pieces_reaches_the_route_intact(settings: Settings) -> None:
    llm = ScriptedLLM()
    question = "".join(f"part {n:04d} of a long question; " for n in range(260))[:7900]
    payload = json.dumps({"messages": question, "stream": False}).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 97):
            yield payload[start : start + 97]

    async with running(settings, llm) as (_, client):
        answer = await client.post(
            "/v1/chatqna", content=pieces(), headers={"content-type": "application/json"}
        )
    assert "content-length" not in answer.request.headers
    assert answer.status_code == 200, answer.text
    assert any(question in message["content"] for message in llm.prompts[-1])


# --------------------------------------------------------------------------- media type

# (role, path, a body the endpoint takes)
JSON_ENDPOINTS = [
    ("megaservice", "/v1/chatqna", {"messages": "How do I export my data?", "stream": False}),
    ("megaservice", "/v1/chat/completions", {"messages": "How do I export?", "stream": False}),
    ("megaservice", "/v1/dataprep/delete", {"file_path": "export.md"}),
    ("retriever", "/v1/retrieval", {"text": "How do I export my data?"}),
]
NOT_JSON = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]


@pytest.mark.parametrize(("role", "path", "body"), JSON_ENDPOINTS)
@pytest.mark.parametrize("content_type", [*NOT_JSON, None])
async def test_a_json_body_sent_as_another_type_is_415(
    client_for: ClientFactory,
    settings: Settings,
    role: str,
    path: str,
    body: dict[str, object],
    content_type: str | None,
) -> None:
    client = await client_for(settings_=settings, role=role)
    headers = {} if content_type is None else {"content-type": content_type}
    response = await client.post(path, content=json.dumps(body).encode(), headers=headers)
    assert response.status_code == 415, response.text
    envelope = response.json()
    assert envelope["error"] == "unsupported_media_type"
    assert "application/json" in envelope["message"]
    document = (await client.get("/openapi.json")).json()
    assert "415" in document["paths"][path]["post"]["responses"]


@pytest.mark.parametrize(("role", "path", "body"), JSON_ENDPOINTS)
@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON; charset=utf-8", "application/x+json"]
)
async def test_a_json_body_is_taken_as_json(
    client_for: ClientFactory,
    settings: Settings,
    role: str,
    path: str,
    body: dict[str, object],
    content_type: str,
) -> None:
    client = await client_for(settings_=settings, role=role)
    headers = {"content-type": content_type}
    response = await client.post(path, content=json.dumps(body).encode(), headers=headers)
    assert response.status_code == 200, response.text


async def test_a_request_without_a_body_is_left_to_the_schema(
    client_for: ClientFactory,
) -> None:
    client = await client_for()
    response = await client.post("/v1/chatqna", headers={"content-type": "text/plain"})
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"
    # An endpoint without a JSON body takes any type, as OPEA's dataprep clients send it.
    listed = await client.post("/v1/dataprep/get", content=b"{}", headers={"content-type": ""})
    assert listed.status_code == 200


@pytest.mark.parametrize(
    ("content_type", "json_type"),
    [
        ("application/json", True),
        (" APPLICATION/JSON ; charset=utf-8", True),
        ("application/problem+json", True),
        ("text/json", False),
        ("application/jsonl", False),
        ("", False),
    ],
)
def test_json_media_types(content_type: str, json_type: bool) -> None:
    assert is_json_media_type(content_type) is json_type
