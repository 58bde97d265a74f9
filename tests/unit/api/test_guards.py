"""Request limits: chats in flight (429), body size (413), and a disconnect freeing its slot."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from chatqna.api.guards import route_path
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


# --------------------------------------------------------------------------- body size


async def test_a_body_over_the_limit_is_413_before_parsing(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_max_request_bytes": 1024})
    client = await client_for(settings_=small)
    response = await client.post("/v1/chatqna", json={"messages": "x" * 2000})
    assert response.status_code == 413
    assert response.json() == {
        "error": "payload_too_large",
        "message": "The request body is larger than 1024 bytes (CHATQNA_MAX_REQUEST_BYTES).",
    }
    assert (await client.post("/v1/chatqna", json={"messages": "x" * 900})).status_code == 200


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
        "headers": [(b"content-type", b"application/json"), (b"host", b"chatqna.test")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8888),
    }


@pytest.mark.parametrize("cancel_lands_in", ["generator", "send"])
async def test_a_disconnect_closes_the_llm_stream_and_frees_the_slot(
    settings: Settings, cancel_lands_in: str
) -> None:
    """Driven at the ASGI level: httpx2's test transport cannot disconnect mid-response.

    The disconnect cancels the response either while the answer's generators await the
    LLM, or while a send is in progress (the generators then wait at a `yield`).
    """
    limited = settings.model_copy(update={"chatqna_max_concurrent_chats": 1})
    llm = EndlessLLM()
    app = create_app(limited, await make_backends(limited, llm=llm), TRACER_PROVIDER)
    gone = asyncio.Event()
    body = json.dumps(ASK).encode()
    sent: list[dict[str, Any]] = []
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
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
            transport=httpx2.ASGITransport(app=app), base_url="http://chatqna.test"
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
        }
    )
    llm = GatedLLM()
    app = create_app(limited, await make_backends(limited, llm=llm), TRACER_PROVIDER)
    key = {"authorization": "Bearer s3cret"}
    transport = httpx2.ASGITransport(app=mounted_at(app, "/chat"))
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=transport, base_url="http://chatqna.test") as client,
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
