"""Request dependencies: the running service's state, and the optional API key check."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from chatqna.backends.factory import Backends
from chatqna.errors import Unauthorized
from chatqna.settings import Settings
from chatqna.telemetry.metrics import ServiceMetrics


@dataclass
class ServiceState:
    """What every handler needs: the settings and the live backends."""

    settings: Settings
    backends: Backends
    metrics: ServiceMetrics


def service_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


def require_api_key(request: Request) -> None:
    """With `CHATQNA_API_KEY` set, demand `Authorization: Bearer <key>` (OpenAI's convention)."""
    settings: Settings = request.app.state.settings
    if settings.chatqna_api_key is None:
        return
    expected = settings.chatqna_api_key.get_secret_value()
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), expected):
        raise Unauthorized("A valid API key is required: send 'Authorization: Bearer <key>'.")


State = Annotated[ServiceState, Depends(service_state)]
