"""`chatqna.app`: what a served process does with its start-up state, the warning when
opentelemetry-instrumentation-fastapi has taken over the request spans, the hosts it answers
to, and the API docs pages it serves only when asked."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from pydantic import SecretStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna import app as app_module
from chatqna.app import create_app, freeze_startup_objects
from chatqna.errors import StartupFailed
from chatqna.settings import Settings
from tests.unit.api.conftest import make_backends
from tests.unit.conftest import TRACER_PROVIDER


def test_freezing_moves_start_up_objects_out_of_the_collectors_reach() -> None:
    start_up = [{"state": [i]} for i in range(1000)]
    try:
        frozen = freeze_startup_objects()
        assert frozen >= len(start_up) and gc.get_freeze_count() == frozen
        collectable = {id(obj) for obj in gc.get_objects()}
        assert not any(id(obj) in collectable for obj in start_up)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


async def startup_failure(app: FastAPI) -> str:
    """Run the app's lifespan start-up as a server does; the failure message it reports."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        sent.append(message)

    with pytest.raises(Exception):  # noqa: B017 (the server sees it; the message is checked)
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    (failed,) = sent
    assert failed["type"] == "lifespan.startup.failed"
    return str(failed["message"])


@pytest.mark.anyio
async def test_a_startup_failure_is_reported_by_its_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def refused(settings: Settings) -> Any:
        raise StartupFailed("REDIS_URL: connection refused")

    monkeypatch.setattr(app_module, "build_backends", refused)
    assert await startup_failure(create_app(Settings())) == "REDIS_URL: connection refused"


@pytest.mark.anyio
async def test_any_other_startup_error_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def bug(settings: Settings) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(app_module, "build_backends", bug)
    message = await startup_failure(create_app(Settings()))
    assert message.startswith("Traceback") and "KeyError: 'a bug'" in message


class OpenTelemetryMiddleware:
    """Stands in for opentelemetry-instrumentation-asgi's middleware (the module and class
    name it has), which opentelemetry-instrumentation-fastapi wraps an app's stack in."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


OpenTelemetryMiddleware.__module__ = "opentelemetry.instrumentation.asgi"


async def contrib_warnings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, instrumented: bool
) -> list[logging.LogRecord]:
    """The warnings naming the FastAPI instrumentation that the app logs at start-up."""

    async def stop_there(settings: Settings) -> Any:
        raise StartupFailed("stop after the warnings")

    monkeypatch.setattr(app_module, "build_backends", stop_there)
    app = create_app(Settings())
    if instrumented:  # as instrument_app does: the built stack runs in its middleware
        build = app.build_middleware_stack
        monkeypatch.setattr(app, "build_middleware_stack", lambda: OpenTelemetryMiddleware(build()))
    with caplog.at_level(logging.WARNING, logger="chatqna"):
        await startup_failure(app)
    named = [
        r for r in caplog.records if "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi" in r.message
    ]
    assert all(record.levelno == logging.WARNING for record in named)
    return named


@pytest.mark.anyio
@pytest.mark.parametrize("instrumented", [True, False])
async def test_the_fastapi_instrumentation_is_named_once_at_start_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, instrumented: bool
) -> None:
    # The tests' global provider is the SDK's, recording.
    assert len(await contrib_warnings(monkeypatch, caplog, instrumented)) == int(instrumented)


def sdk_disabled_provider(monkeypatch: pytest.MonkeyPatch) -> TracerProvider:
    """What opentelemetry-instrument installs under OTEL_SDK_DISABLED=true."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    provider = TracerProvider()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    return provider


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["sdk_disabled", "none_installed", "no_op"])
async def test_the_instrumentation_is_not_named_when_nothing_is_recorded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, provider: str
) -> None:
    installed = {
        "sdk_disabled": sdk_disabled_provider(monkeypatch),
        "none_installed": trace.ProxyTracerProvider(),
        "no_op": trace.NoOpTracerProvider(),
    }[provider]
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: installed)
    assert await contrib_warnings(monkeypatch, caplog, instrumented=True) == []


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[FastAPI]:
    app = create_app(settings, await make_backends(settings), tracer_provider=TRACER_PROVIDER)
    async with app.router.lifespan_context(app):
        yield app


async def status_for(app: FastAPI, host: str, path: str = "/v1/models") -> int:
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url=f"http://{host}") as client:
        return (await client.get(path)).status_code


@pytest.mark.anyio
async def test_on_a_loopback_address_only_the_loopback_names_are_answered(tmp_path: Path) -> None:
    """Another name in `Host` is a site that resolved its own name to 127.0.0.1 (DNS
    rebinding) to read the answers with its pages."""
    async with served(Settings(chatqna_data_dir=tmp_path)) as app:
        for host in ("localhost:8888", "127.0.0.1:8888", "[::1]:8888", "LOCALHOST", "127.0.0.1"):
            assert await status_for(app, host) == 200, host
        for host in ("rebound.example:8888", "127.0.0.2:8888", "localhost.example"):
            assert await status_for(app, host) == 400, host
            assert await status_for(app, host, "/v1/health_check") == 400, host


@pytest.mark.anyio
async def test_on_any_other_address_every_name_is_answered_unless_listed(tmp_path: Path) -> None:
    everywhere = Settings(chatqna_data_dir=tmp_path, chatqna_host="0.0.0.0")
    async with served(everywhere) as app:
        for host in ("chatqna-backend:8888", "10.42.0.7:8888", "localhost:8888"):
            assert await status_for(app, host) == 200, host
    listed = everywhere.model_copy(update={"chatqna_allowed_hosts": ["chat.example.com"]})
    async with served(listed) as app:
        assert await status_for(app, "chat.example.com") == 200
        assert await status_for(app, "127.0.0.1:8888") == 200  # the machine's own checks
        assert await status_for(app, "chatqna-backend:8888") == 400


@pytest.mark.anyio
async def test_a_refused_host_gets_the_envelope_and_is_counted_under_its_route(
    tmp_path: Path,
) -> None:
    """As the other guards' refusals are: 400 `invalid_host`, before the API key is asked
    for, and in the request metrics."""
    locked = Settings(chatqna_data_dir=tmp_path, chatqna_api_key=SecretStr("s3cret"))
    async with served(locked) as app:
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://rebound.example") as c:
            refused = await c.post("/v1/chatqna", json={"messages": "Hello?"})
        assert refused.status_code == 400
        assert refused.json()["error"] == "invalid_host"
        async with httpx2.AsyncClient(transport=transport, base_url="http://localhost") as c:
            scrape = (await c.get("/metrics", headers={"Authorization": "Bearer s3cret"})).text
    counted = 'chatqna_requests_total{method="POST",route="/v1/chatqna",status="400"} 1.0'
    assert counted in scrape.splitlines()


@pytest.mark.anyio
async def test_the_api_docs_pages_are_served_only_when_asked(tmp_path: Path) -> None:
    """Their pages load scripts from a CDN onto the origin the chat UI keeps its key in."""
    async with served(Settings(chatqna_data_dir=tmp_path)) as app:
        for path in ("/docs", "/redoc"):
            assert await status_for(app, "localhost", path) == 404, path
        assert await status_for(app, "localhost", "/openapi.json") == 200
    async with served(Settings(chatqna_data_dir=tmp_path, chatqna_api_docs=True)) as app:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert await status_for(app, "localhost", path) == 200, path
