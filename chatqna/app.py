"""`create_app(settings, backends=None)`: the FastAPI application.

The lifespan builds the backends once (unless a test passes its own) and closes them at
shutdown; start-up warnings from the settings are logged once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider

from chatqna import __version__
from chatqna.api import chat, dataprep, health, observability, retrieval, ui
from chatqna.api.deps import ServiceState
from chatqna.api.errors import install_error_handlers
from chatqna.api.observability import RequestMetricsMiddleware
from chatqna.backends.factory import Backends, build_backends, build_retrieval_backends
from chatqna.settings import Settings
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.tracing import build_tracer_provider, install_tracer_provider

logger = logging.getLogger("chatqna")


def create_app(
    settings: Settings,
    backends: Backends | None = None,
    tracer_provider: TracerProvider | None = None,
    *,
    role: Literal["megaservice", "retriever"] = "megaservice",
) -> FastAPI:
    """Build the app; tests may inject `backends` (not closed here) and a tracer provider.

    Without an injected provider, tracing is configured from the `OTEL_*` settings and,
    when on, installed as the process's global provider.
    """
    owned_provider = None
    if tracer_provider is None:
        owned_provider = tracer_provider = build_tracer_provider(settings)
        if owned_provider is not None:
            install_tracer_provider(owned_provider)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for warning in settings.startup_warnings():
            logger.warning(warning)
        owned = backends is None
        if backends is not None:
            live = backends
        elif role == "retriever":
            live = await build_retrieval_backends(settings)
        else:
            live = await build_backends(settings)
        app.state.service = ServiceState(settings, live, app.state.metrics)
        try:
            yield
        finally:
            if owned:
                await live.aclose()
            if owned_provider is not None:
                owned_provider.shutdown()  # flush the spans still batched

    app = FastAPI(
        title="ChatQnA" if role == "megaservice" else "ChatQnA retriever",
        version=__version__,
        description="Retrieval-augmented chat with multi-turn retrieval.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics()
    install_error_handlers(app)
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)
    if tracer_provider is not None:
        # No spans for each ASGI send/receive: a streamed answer would add one per token.
        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=tracer_provider,
            excluded_urls="metrics,health_check,ready",
            exclude_spans=["receive", "send"],
        )
    app.include_router(health.router)
    if role == "megaservice":
        app.include_router(chat.router)
        app.include_router(ui.router)
    else:
        app.include_router(retrieval.router)
    app.include_router(dataprep.router)
    app.include_router(observability.router)
    return app
