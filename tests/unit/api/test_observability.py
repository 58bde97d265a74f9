"""Request metrics and the turn's spans: a client that leaves is no server error (499), a
refusal before routing is counted under its route, an unknown path stays `unmatched`, and
an invented method is `_OTHER`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import SecretStr
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from chatqna.api.observability import UNMATCHED, RouteLabel
from chatqna.app import create_app
from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.protocols import Delta, GenerationParams
from chatqna.errors import UpstreamError
from chatqna.settings import Settings
from chatqna.telemetry import names
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse
from tests.unit.api.test_guards import EndlessLLM, chat_scope
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

ASK = {"messages": [{"role": "user", "content": "How do I export my data?"}]}


class HeldLLM(ScriptedLLM):
    """Streams one token, then holds its stream open until released."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        yield Delta(text="held ")
        self.started.set()
        await self.release.wait()
        yield Delta(finish_reason="stop")


def ended(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [span for span in spans.get_finished_spans() if span.name == name]
    assert len(found) == 1, [span.name for span in spans.get_finished_spans()]
    return found[0]


def requests_counted(text: str, route: str, status: int) -> float:
    """`chatqna_requests_total` of POSTs to `route` answered with `status`, from a scrape."""
    wanted = f'chatqna_requests_total{{method="POST",route="{route}",status="{status}"}} '
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.removeprefix(wanted))
    return 0.0


# ----------------------------------------------------------------------- client left


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_a_client_gone_mid_stream_is_499_and_no_error_on_the_turns_spans(
    settings: Settings, spans: InMemorySpanExporter, spec_version: str
) -> None:
    """Driven at the ASGI level (httpx2's test transport cannot disconnect mid-response).
    An ASGI 2.3 server (uvicorn) says so on `receive`, which Starlette's streaming response
    listens to; a 2.4 server raises `OSError` from the next `send`."""
    llm = EndlessLLM()
    app = create_app(settings, await make_backends(settings, llm=llm), TRACER_PROVIDER)
    gone = asyncio.Event()
    requests = [{"type": "http.request", "body": json.dumps(ASK).encode(), "more_body": False}]
    tokens_sent = 0

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal tokens_sent
        if gone.is_set() and spec_version == "2.4":
            raise OSError("the client is gone")
        tokens_sent += message.get("body", b"").count(b"again")
        if tokens_sent >= 3:
            gone.set()

    async with app.router.lifespan_context(app):
        # Starlette raises `ClientDisconnect` to a 2.4 server, which expects it.
        with contextlib.suppress(ClientDisconnect):
            await asyncio.wait_for(app(chat_scope(spec_version), receive, send), timeout=10)
        scrape = (await _scrape(app)).text
    assert llm.closed
    for name in (names.SPAN_GENERATE, names.SPAN_ORCHESTRATE):
        span = ended(spans, name)
        assert span.status.status_code == StatusCode.UNSET, (name, span.status)
        assert span.attributes is not None
        assert span.attributes[names.CLIENT_DISCONNECTED] is True, name
        assert not [event for event in span.events if event.name == "exception"], name
    assert requests_counted(scrape, "/v1/chatqna", 499) == 1
    assert requests_counted(scrape, "/v1/chatqna", 200) == 0


async def test_a_client_that_stops_reading_is_no_llm_timeout_and_no_error_on_the_spans(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    """Driven at the ASGI level: the client's `send` blocks, as a socket whose buffers are
    full does, from the first token until it reads on, past the answer's deadline."""
    quick = settings.model_copy(update={"llm_generation_timeout_seconds": 0.05})
    llm = EndlessLLM()
    app = create_app(quick, await make_backends(quick, llm=llm), TRACER_PROVIDER)
    requests = [{"type": "http.request", "body": json.dumps(ASK).encode(), "more_body": False}]
    reads_on = asyncio.Event()
    body = bytearray()

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        body.extend(message.get("body", b""))
        if b"again" in body:
            await reads_on.wait()

    async with app.router.lifespan_context(app):
        answering = asyncio.ensure_future(app(chat_scope("2.3"), receive, send))
        async with asyncio.timeout(10):  # a guard, not the behaviour
            while not llm.closed:  # closed at the deadline, while the client still stalls
                await asyncio.sleep(0.01)
        generate = ended(spans, names.SPAN_GENERATE)
        reads_on.set()
        await asyncio.wait_for(answering, timeout=10)
        scrape = (await _scrape(app)).text
    assert "chatqna_upstream_errors_total{" not in scrape  # no LLM timeout counted
    for span in (generate, ended(spans, names.SPAN_ORCHESTRATE)):
        assert span.status.status_code == StatusCode.UNSET, (span.name, span.status)
        assert span.attributes is not None
        assert span.attributes[names.CLIENT_STALLED] is True, span.name
        assert names.CLIENT_DISCONNECTED not in span.attributes, span.name
        assert not [event for event in span.events if event.name == "exception"], span.name
    events = parse_sse(body.decode())
    assert events[-1] == ("message", "[DONE]") and events[-2][0] == "error"
    assert json.loads(events[-2][1])["error"] == "request_timeout"
    assert "stopped reading" in json.loads(events[-2][1])["message"]
    assert requests_counted(scrape, "/v1/chatqna", 200) == 1  # it read the stream to its end


async def test_an_upstream_failure_mid_stream_is_still_an_error(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    llm = ScriptedLLM(fail_after=1, error=UpstreamError("cut", backend="llm"))
    client = await client_for(await make_backends(settings, llm=llm))
    response = await client.post("/v1/chatqna", json=ASK)
    assert response.status_code == 200
    assert parse_sse(response.text)[-2][0] == "error"
    for name in (names.SPAN_GENERATE, names.SPAN_ORCHESTRATE):
        span = ended(spans, name)
        assert span.status.status_code == StatusCode.ERROR, name
        assert span.attributes is not None
        assert names.CLIENT_DISCONNECTED not in span.attributes, name
    scrape = (await client.get("/metrics")).text
    assert requests_counted(scrape, "/v1/chatqna", 200) == 1  # the stream ended as documented
    assert requests_counted(scrape, "/v1/chatqna", 499) == 0


async def _scrape(app: Any) -> httpx2.Response:
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://localhost:8888"
    ) as client:
        return await client.get("/metrics")


# ----------------------------------------------------------------------- route label


async def test_a_chat_refused_as_too_many_is_counted_under_its_route(
    client_for: ClientFactory, settings: Settings
) -> None:
    limited = settings.model_copy(
        update={"chatqna_max_concurrent_chats": 1, "chatqna_queue_timeout_seconds": 0}
    )
    llm = HeldLLM()
    client = await client_for(await make_backends(limited, llm=llm), limited)
    first = asyncio.create_task(client.post("/v1/chatqna", json=ASK))
    await llm.started.wait()  # the only slot is taken, mid-stream
    assert (await client.post("/v1/chatqna", json=ASK)).status_code == 429
    llm.release.set()
    assert (await first).status_code == 200
    scrape = (await client.get("/metrics")).text
    assert requests_counted(scrape, "/v1/chatqna", 429) == 1
    assert requests_counted(scrape, UNMATCHED, 429) == 0


async def test_a_body_refused_as_too_large_is_counted_under_its_route(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_max_request_bytes": 1024})
    client = await client_for(settings_=small)
    oversized = {"messages": [{"role": "user", "content": "x" * 2048}]}
    assert (await client.post("/v1/chatqna", json=oversized)).status_code == 413
    scrape = (await client.get("/metrics")).text
    assert requests_counted(scrape, "/v1/chatqna", 413) == 1
    assert requests_counted(scrape, UNMATCHED, 413) == 0


async def test_a_missing_key_is_counted_under_the_route_and_unknown_paths_stay_unmatched(
    client_for: ClientFactory, settings: Settings
) -> None:
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr("s3cret")})
    client = await client_for(settings_=locked)
    assert (await client.post("/v1/chatqna", json=ASK)).status_code == 401
    assert (await client.post("/wp-login.php", json=ASK)).status_code == 401
    key = {"authorization": "Bearer s3cret"}
    assert (await client.post("/.env", json=ASK, headers=key)).status_code == 404
    scrape = (await client.get("/metrics", headers=key)).text
    assert requests_counted(scrape, "/v1/chatqna", 401) == 1
    assert requests_counted(scrape, UNMATCHED, 401) == 1
    assert requests_counted(scrape, UNMATCHED, 404) == 1
    assert "wp-login" not in scrape and ".env" not in scrape


async def test_an_invented_method_is_counted_as_other(
    client_for: ClientFactory, settings: Settings
) -> None:
    client = await client_for(settings_=settings)
    for method in ("BREW", "WHEN", "brew"):
        assert (await client.request(method, "/v1/chatqna")).status_code == 405
    scrape = (await client.get("/metrics")).text
    counted = [
        line
        for line in scrape.splitlines()
        if line.startswith("chatqna_requests_total{") and 'route="/v1/chatqna"' in line
    ]
    assert counted == [
        'chatqna_requests_total{method="_OTHER",route="/v1/chatqna",status="405"} 3.0'
    ]


async def _endpoint() -> None:
    return None


@pytest.mark.parametrize(
    ("path", "root", "label"),
    [
        ("/v1/chatqna", "", "/v1/chatqna"),
        ("/chat/v1/chatqna", "/chat", "/v1/chatqna"),  # served under a root path
        ("/ui/app.js", "", "/ui/{name}"),  # a template, not the path
        ("/v1/chatqna/extra", "", UNMATCHED),
        ("/admin", "", UNMATCHED),
    ],
)
def test_an_unrouted_request_is_labelled_by_the_route_its_path_names(
    path: str, root: str, label: str
) -> None:
    routes = [Route("/v1/chatqna", _endpoint), Route("/ui/{name}", _endpoint)]
    assert RouteLabel(routes)({"type": "http", "path": path, "root_path": root}) == label


def test_a_routed_request_keeps_its_route_s_template() -> None:
    route = Route("/ui/{name}", _endpoint)
    scope = {"type": "http", "path": "/ui/app.js", "root_path": "", "route": route}
    assert RouteLabel([])(scope) == "/ui/{name}"
