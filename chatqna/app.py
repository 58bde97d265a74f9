"""`create_app(settings, backends=None)`: the FastAPI application.

The lifespan builds the backends once (unless a test passes its own) and closes them at
shutdown; start-up warnings from the settings are logged once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from chatqna import __version__
from chatqna.api import chat, dataprep, health
from chatqna.api.deps import ServiceState
from chatqna.api.errors import install_error_handlers
from chatqna.backends.factory import Backends, build_backends
from chatqna.settings import Settings

logger = logging.getLogger("chatqna")


def create_app(settings: Settings, backends: Backends | None = None) -> FastAPI:
    """Build the app; `backends` lets tests inject their own (they are not closed then)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for warning in settings.startup_warnings():
            logger.warning(warning)
        owned = backends is None
        live = await build_backends(settings) if backends is None else backends
        app.state.service = ServiceState(settings=settings, backends=live)
        try:
            yield
        finally:
            if owned:
                await live.aclose()

    app = FastAPI(
        title="ChatQnA",
        version=__version__,
        description="Retrieval-augmented chat with multi-turn retrieval.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(chat.router)
    app.include_router(dataprep.router)
    return app
