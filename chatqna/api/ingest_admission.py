"""The admission of uploads: a `POST /v1/dataprep/ingest` takes its place in the parse
pool before its body is read, and keeps it while the body keeps coming.

It is ASGI middleware like the guards (`chatqna.api.guards`), installed inside them, so an
upload refused for its key or its size never takes a place, and for the same reason: the
place is held for the whole life of the request, and answered from here when the body
stalls, before any route has a say.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna.api.guards import UPLOAD_PATH, refuse, route_path
from chatqna.errors import ChatQnAError, RequestTimeout
from chatqna.ingest.parse_pool import ParsePool

# Where `IngestAdmission` leaves an upload's `ParseSlot` for the route, in the ASGI scope.
PARSE_SLOT = "chatqna.parse_slot"


class UploadPauses:
    """An admitted upload's `receive` and `send`, cutting its body off when it pauses: each
    wait for the next part of the body may last `timeout_seconds` at most (a slow but
    steady upload goes on however long it takes), or the upload is answered 408 with
    `Connection: close` here, and the route hears that its client has gone (it stops, and
    whatever it would answer is dropped). Once the body is in, nothing is timed."""

    def __init__(self, timeout_seconds: float, scope: Scope, receive: Receive, send: Send):
        self.timeout_seconds = timeout_seconds
        self._scope, self._receive, self._send = scope, receive, send
        self._body_in = self._cut = self._started = False

    async def receive(self) -> Message:
        if self._cut:
            return {"type": "http.disconnect"}
        if self._body_in:
            return await self._receive()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                message = await self._receive()
        except TimeoutError:
            self._cut = True
            if not self._started:  # else the answer is on its way: the route just stops
                error = RequestTimeout(
                    f"The upload's body paused for more than {self.timeout_seconds:g} "
                    "seconds (CHATQNA_BODY_TIMEOUT_SECONDS); send it again."
                )
                await refuse(
                    error, self._scope, self._receive, self._send, headers={"Connection": "close"}
                )
            return {"type": "http.disconnect"}
        self._body_in = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self._cut and not self._started:
            return  # answered 408 already
        self._started = self._started or message["type"] == "http.response.start"
        await self._send(message)


class IngestAdmission:
    """Admits a `POST /v1/dataprep/ingest` into the parse pool before its body is read.

    A request beyond the pool's places for requests in flight is refused (429,
    `Retry-After`) at once, having cost neither the spooling of its upload nor the fetching
    of its links; an admitted one keeps its place (`scope[PARSE_SLOT]`, the route parses
    under it) until it is done, whether it succeeds, fails, or its client leaves. Its body
    may pause for `body_timeout_seconds` at most (`UploadPauses`, else 408), so clients that
    send the start of an upload and then nothing give their places back. A place is no
    working token: while its body arrives a request holds none, and the route waits for
    one only once the body is in, before it reads the uploads into memory. `parse_pool`
    gives the running service's pool, which exists only once the app has started.
    """

    def __init__(
        self, app: ASGIApp, parse_pool: Callable[[], ParsePool], body_timeout_seconds: float
    ) -> None:
        if body_timeout_seconds <= 0:
            raise ValueError("body_timeout_seconds must be above 0")
        self.app = app
        self.parse_pool = parse_pool
        self.body_timeout_seconds = body_timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or route_path(scope) != UPLOAD_PATH:
            await self.app(scope, receive, send)
            return
        async with contextlib.AsyncExitStack() as stack:
            try:
                slot = await stack.enter_async_context(self.parse_pool().admit())
            except ChatQnAError as error:  # too many requests, or shutting down
                await refuse(error, scope, receive, send)
                return
            pauses = UploadPauses(self.body_timeout_seconds, scope, receive, send)
            await self.app({**scope, PARSE_SLOT: slot}, pauses.receive, pauses.send)
