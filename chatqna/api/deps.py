"""Request dependencies: the running service's state, and the optional API key check.

The key is enforced for every path by `chatqna.api.guards.ApiKeyGuard`; `require_api_key`
repeats the check on the routers that serve data, so a path wrongly listed as public still
refuses them.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from pydantic import SecretStr

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


def api_key_matches(header: str | None, key: SecretStr) -> bool:
    """True for `Authorization: Bearer <key>` (OpenAI's convention), compared in constant time."""
    scheme, _, token = (header or "").partition(" ")
    expected = key.get_secret_value().encode()
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected)


def require_api_key(request: Request) -> None:
    """With `CHATQNA_API_KEY` set, demand `Authorization: Bearer <key>`."""
    settings: Settings = request.app.state.settings
    if settings.chatqna_api_key is None:
        return
    if not api_key_matches(request.headers.get("authorization"), settings.chatqna_api_key):
        raise Unauthorized("A valid API key is required: send 'Authorization: Bearer <key>'.")


State = Annotated[ServiceState, Depends(service_state)]
