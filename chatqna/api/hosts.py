"""`HostGuard`: refuses a request for a host the service does not answer to.

Which `Host` headers are answered is Starlette's `TrustedHostMiddleware`'s to decide, with
the patterns of `Settings.allowed_hosts` (exact names, `*.example.com`, `*`, IPv6 addresses
in brackets, any port; a missing or malformed header never). It refuses with a plain-text
400 of its own, which no option changes; so it is asked with an app that only reports the
request let through, its own answer is dropped, and the guard refuses with the error
envelope instead: 400 `invalid_host`. `create_app` installs the guard inside the
request-metrics middleware, so these refusals are counted like the other guards'.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna.api.guards import refuse
from chatqna.errors import InvalidHost

# What the app behind Starlette's check sends: the request was let through.
ANSWERED = "chatqna.host.answered"


async def report_answered(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": ANSWERED})


async def no_body() -> Message:
    """The `receive` the check is given: it reads no body (nor does its refusal)."""
    return {"type": "http.disconnect"}


class HostGuard:
    """Lets a request whose `Host` is one of `allowed_hosts` through; refuses any other
    (HTTP, or a WebSocket handshake, as Starlette does) with 400 `invalid_host`."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self._check = TrustedHostMiddleware(
            report_answered, allowed_hosts=allowed_hosts, www_redirect=False
        )

    async def answers_to(self, scope: Scope) -> bool:
        """Whether Starlette's check lets the request through (its refusal is dropped)."""
        answered = False

        async def heard(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == ANSWERED

        await self._check(scope, no_body, heard)
        return answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or await self.answers_to(scope):
            await self.app(scope, receive, send)
            return
        await refuse(InvalidHost(), scope, receive, send)
