"""Request dependencies: the running service's state, and the optional API key check.

The key is enforced for every path by `chatqna.api.guards.ApiKeyGuard`; `require_api_key`
repeats the check on the routers that serve data, so a path wrongly listed as public still
refuses them. Both accept the key as `Authorization: Bearer <key>` (API clients) or as the
password of HTTP Basic credentials (the browser's own sign-in prompt, for the chat UI).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated

from fastapi import Depends, Request
from pydantic import SecretStr
from starlette.datastructures import Headers

from chatqna.backends.bundle import Backends
from chatqna.errors import Unauthorized
from chatqna.ingest.parse_pool import ParsePool
from chatqna.pipeline.orchestrator import Pipeline
from chatqna.settings import Settings
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.observer import TurnTelemetry


@dataclass
class ServiceState:
    """What every handler needs: the settings, the live backends, the chat pipeline, and
    the threads dataprep parses on."""

    settings: Settings
    backends: Backends
    metrics: ServiceMetrics
    parse_pool: ParsePool = field(default_factory=ParsePool)

    @cached_property
    def pipeline(self) -> Pipeline:
        """Built on first use, once: the multi-turn strategy and the turn observer."""
        observer = TurnTelemetry(self.metrics, self.settings.chatqna_trace_content)
        return Pipeline.build(self.settings, self.backends, observer)


# Dependencies are `async def` so FastAPI runs them on the loop, not on a worker thread.
async def service_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


API_KEY_REQUIRED = "A valid API key is required: send 'Authorization: Bearer <key>'."
# Methods that change nothing; a write needs more than credentials the browser adds itself.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# `Sec-Fetch-Site` values of a request this origin's own pages (or the user) started.
OWN_SITE = frozenset({"same-origin", "none"})


def basic_password(credentials: bytes) -> bytes | None:
    """The password of `Basic <base64(user:password)>` credentials; None when malformed."""
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    _, colon, password = decoded.partition(b":")
    return password if colon else None


def api_key_matches(header: str | None, key: SecretStr, *, basic: bool = True) -> bool:
    """True for `Bearer <key>` (OpenAI's convention) or, with `basic`, Basic credentials whose
    password is the key (any user name); compared in constant time."""
    try:
        # Header values arrive decoded as Latin-1; encoding back gives the bytes as sent
        # (UTF-8 from a browser, whose prompt the challenge's `charset="UTF-8"` asks for).
        raw = (header or "").strip().encode("latin-1")
    except UnicodeEncodeError:
        return False
    scheme, _, credentials = raw.partition(b" ")
    offered: bytes | None = None
    if scheme.lower() == b"bearer":
        offered = credentials.strip()
    elif scheme.lower() == b"basic" and basic:
        offered = basic_password(credentials)
    expected = key.get_secret_value().encode()
    return offered is not None and secrets.compare_digest(offered, expected)


def request_has_key(headers: Headers, method: str, key: SecretStr) -> bool:
    """Whether a request carries the key.

    A browser resends Basic credentials it has cached on its own, also on a form another
    site posts here (cross-site request forgery). So for a write, Basic counts only when the
    browser says this origin started the request (`Sec-Fetch-Site`), or when no browser
    sent it (no such header). Bearer is never added by a browser, so it always counts.
    """
    site = headers.get("sec-fetch-site")
    basic = method.upper() in SAFE_METHODS or site is None or site.lower() in OWN_SITE
    return api_key_matches(headers.get("authorization"), key, basic=basic)


async def require_api_key(request: Request) -> None:
    """With `CHATQNA_API_KEY` set, demand the key (Bearer, or Basic from this origin)."""
    settings: Settings = request.app.state.settings
    if settings.chatqna_api_key is None:
        return
    if not request_has_key(request.headers, request.method, settings.chatqna_api_key):
        raise Unauthorized(API_KEY_REQUIRED)


State = Annotated[ServiceState, Depends(service_state)]
