"""`create_app(settings, backends=None)`: the FastAPI application.

The lifespan builds the backends once (unless a test passes its own) and closes them at
shutdown; start-up warnings (from the settings, and spreadsheets refused when openpyxl
would expand XML entities) are logged once. `serve_workers` runs the app in several
processes on one port (`chatqna serve --workers N`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypedDict

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.telemetry import TelemetryConfig
from opentelemetry.trace import TracerProvider
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna import __version__
from chatqna.api import chat, dataprep, health, observability, retrieval, ui
from chatqna.api.cross_site import CrossSiteGuard
from chatqna.api.deps import ServiceState
from chatqna.api.errors import install_error_handlers
from chatqna.api.guards import (
    ApiKeyGuard,
    BodySizeLimit,
    ChatConcurrencyLimit,
    UploadEndCheck,
    route_path,
)
from chatqna.api.hosts import HostGuard
from chatqna.api.ingest_admission import IngestAdmission
from chatqna.api.observability import RequestMetricsMiddleware
from chatqna.api.origins import own_host_names
from chatqna.backends.bundle import Backends
from chatqna.composition import build_backends, build_retrieval_backends
from chatqna.errors import StartupFailed
from chatqna.logging_setup import configure_logging
from chatqna.settings import Settings
from chatqna.telemetry.caller_context import CallerContext
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.tracing import (
    CONTRIB_WARNING,
    configure_propagation,
    configure_tracing,
    contrib_instrumented,
    tracing_recorded,
)

logger = logging.getLogger("chatqna")


# The multipart form of an upload to /v1/dataprep/ingest: at most this many files, and
# this many other fields (link_list, chunk_size, chunk_overlap, and the fields OPEA's
# clients add, which are ignored); beyond either, 400. What the files expand to is bounded
# by CHATQNA_DATAPREP_MAX_REQUEST_TEXT_CHARS and CHATQNA_DATAPREP_MAX_REQUEST_CHUNKS.
MAX_FORM_FILES = 1000
MAX_FORM_FIELDS = 64

# The probes and the scrape: frequent, and nobody looks for them in a trace.
UNTRACED_PATHS = frozenset({"/metrics", "/v1/health_check", "/v1/ready"})


def untraced(scope: Scope) -> bool:
    return scope.get("type") == "http" and route_path(scope) in UNTRACED_PATHS


def fastapi_telemetry(tracer_provider: TracerProvider | None) -> TelemetryConfig:
    """FastAPI's own OpenTelemetry support makes the request's SERVER span (with the global
    provider unless one is given; nothing while none is installed, when `CallerContext`
    passes the caller's context on instead). Metrics stay Prometheus's, exporters are set
    up by `configure_tracing`, and per-operation spans (dependencies, serialisation) are
    left out."""
    return {
        "tracer_provider": tracer_provider,
        "tracing": True,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
        "auto_configure": False,
        "exclude": untraced,
    }


class StartupFailureReport:
    """Tells the server a start-up that failed with `StartupFailed` by its one line, which
    names the variable to fix. Starlette reports a failed lifespan with the whole traceback
    (uvicorn logs it), which buries that line; any other failure keeps its traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def report(message: Message) -> None:
            failure = sys.exception()  # Starlette sends the failure while it handles it
            if message["type"] == "lifespan.startup.failed" and isinstance(failure, StartupFailed):
                message = {**message, "message": str(failure)}
            await send(message)

        await self.app(scope, receive, report)


def install_guards(app: FastAPI, settings: Settings, routes: Iterable[BaseRoute]) -> None:
    """Middleware, innermost first: chat concurrency, an upload's admission, an upload's
    end, body size, API key, another site's writes, the `Host` check, metrics, CORS.

    Metrics sit outside the guards so refusals are counted, under the route of `routes` that
    the refused path names; CORS sits outside them so a browser can read a refusal and a
    preflight needs no key. CORS is off with no origins. A request for a host the service
    does not answer to (`Settings.allowed_hosts`) is refused first of the guards (400
    `invalid_host`); a CORS preflight, which carries no data, is answered by CORS before it.
    The names listed in `CHATQNA_ALLOWED_HOSTS` are also the service's own origins to the
    cross-site and API key guards (`own_host_names`), for a proxy that rewrites `Host`.
    """
    own_hosts = own_host_names(settings.chatqna_allowed_hosts)
    app.add_middleware(
        ChatConcurrencyLimit,
        paths=chat.CHAT_PATHS,
        limit=settings.chatqna_max_concurrent_chats,
        queue_timeout_seconds=settings.chatqna_queue_timeout_seconds,
        body_timeout_seconds=settings.chatqna_body_timeout_seconds,
    )
    app.add_middleware(
        IngestAdmission,
        parse_pool=lambda: app.state.service.parse_pool,
        body_timeout_seconds=settings.chatqna_body_timeout_seconds,
    )
    app.add_middleware(UploadEndCheck)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.chatqna_max_request_bytes,
        max_upload_bytes=settings.chatqna_max_upload_request_bytes,
    )
    app.add_middleware(ApiKeyGuard, api_key=settings.chatqna_api_key, own_hosts=own_hosts)
    app.add_middleware(
        CrossSiteGuard, allowed_origins=settings.chatqna_cors_origins, own_hosts=own_hosts
    )
    app.add_middleware(HostGuard, allowed_hosts=settings.allowed_hosts())
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics, routes=routes)
    if settings.chatqna_cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.chatqna_cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["X-Trace-Id", "Retry-After"],
            max_age=600,
        )


class DocsPages(TypedDict):
    docs_url: str | None
    redoc_url: str | None


def docs_pages(settings: Settings) -> DocsPages:
    """Where FastAPI serves its API docs pages: nowhere unless `CHATQNA_API_DOCS` is on.
    Both load their scripts from cdn.jsdelivr.net into this origin, where the chat UI keeps
    an API key in session storage; /openapi.json is served either way."""
    if settings.chatqna_api_docs:
        return {"docs_url": "/docs", "redoc_url": "/redoc"}
    return {"docs_url": None, "redoc_url": None}


def freeze_startup_objects() -> int:
    """Collect once, then move every object alive now (modules, the app, the backends and
    the index) out of the collector's reach for good (`gc.freeze`); returns how many.

    Full collections then walk only what requests created, so those the collector starts
    under load take a few milliseconds instead of tens. Frozen objects are still freed when
    nothing refers to them; only reference cycles among them are never collected, which
    start-up state does not form.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def create_app(
    settings: Settings,
    backends: Backends | None = None,
    tracer_provider: TracerProvider | None = None,
    *,
    role: Literal["megaservice", "retriever"] = "megaservice",
) -> FastAPI:
    """Build the app; tests may inject `backends` (not closed here) and a tracer provider.

    Without an injected provider, tracing is configured from the `OTEL_*` variables and,
    when on, installed as the process's global provider (unless one is installed already).
    `OTEL_PROPAGATORS=none` is made safe for extraction either way (`configure_propagation`).
    """
    configure_propagation()
    owned_tracing = configure_tracing(settings) if tracer_provider is None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for warning in [*settings.startup_warnings(), *dataprep.startup_warnings()]:
            logger.warning(warning)
        if contrib_instrumented(app) and tracing_recorded():
            logger.warning(CONTRIB_WARNING)
        owned = backends is None
        if backends is not None:
            live = backends
        elif role == "retriever":
            live = await build_retrieval_backends(settings)
        else:
            live = await build_backends(settings)
        service = ServiceState(settings, live, app.state.metrics)
        app.state.service = service
        try:
            if owned:  # a served process (backends built here) keeps its start-up state
                freeze_startup_objects()
            yield
        finally:
            service.parse_pool.close()
            if owned:
                await live.aclose()
            if owned_tracing is not None:  # flush the spans still batched, within a bound
                await asyncio.to_thread(owned_tracing.shutdown)

    app = FastAPI(
        title="ChatQnA" if role == "megaservice" else "ChatQnA retriever",
        version=__version__,
        description="Retrieval-augmented chat with multi-turn retrieval.",
        lifespan=lifespan,
        telemetry=fastapi_telemetry(tracer_provider),
        form_limits={"max_files": MAX_FORM_FILES, "max_fields": MAX_FORM_FIELDS},
        **docs_pages(settings),
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics()
    install_error_handlers(app)
    routers = include_routers(app, role)
    routes = [*app.router.routes, *(route for router in routers for route in router.routes)]
    install_guards(app, settings, routes)
    app.add_middleware(CallerContext, exclude=untraced)  # outside X-Trace-Id's middleware
    app.add_middleware(StartupFailureReport)
    return app


def include_routers(app: FastAPI, role: Literal["megaservice", "retriever"]) -> list[APIRouter]:
    """The endpoints of `role`: chat and the UI for the megaservice, `/v1/retrieval` for the
    retriever; health, dataprep and observability for both. Returns the routers included."""
    routers = [health.router]
    if role == "megaservice":
        routers += [chat.router, ui.router]
    else:
        routers.append(retrieval.router)
    routers += [dataprep.router, observability.router]
    for router in routers:
        app.include_router(router)
    return routers


def app_from_environment() -> FastAPI:
    """The app of one worker of `chatqna serve --workers N` (settings from the environment)."""
    settings = Settings.model_validate({})  # from the environment
    configure_logging(settings)
    return create_app(settings)


def serve_workers(count: int, options: dict[str, Any]) -> bool:
    """`uvicorn.run` with `count` workers, except that a worker failing to start is told
    apart from a shutdown (uvicorn's supervisor stops and returns normally in both cases):
    False when one did, so the command can exit non-zero."""
    from uvicorn import Config
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    config = Config("chatqna.app:app_from_environment", factory=True, workers=count, **options)
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    return all(process.exitcode != STARTUP_FAILURE for process in supervisor.processes)
