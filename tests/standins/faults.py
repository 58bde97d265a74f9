"""Faults for the stand-in upstreams: what can go wrong, per route, and how it is done.

`FaultBook` holds the faults in force and per-route counters (thread-safe, so a test can set
faults from its own thread while the server runs in another). `body_fault` turns a fault
into the response a non-streamed route gives; the chat stream's own faults live with the
chat model in `tests.standins.servers`. A reset is a real TCP reset (RST, via `SO_LINGER`
0), found through the uvicorn server that `serve_in_thread` or `main` records on the app.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

ROUTES = ("embeddings", "rerank", "chat", "condense", "retrieval")
BODY_FAULTS = ("slow", "http_error", "reset", "truncated", "malformed", "endless")
FAULTS = (*BODY_FAULTS, "wrong_dimension")
APPLICABLE = {route: set(BODY_FAULTS) for route in ROUTES} | {"embeddings": set(FAULTS)}
MALFORMED_BODY = b'{"object": "list", "data": [{"index": 0, oops'
TRICKLE_SECONDS = 0.1  # an endless body sends a byte this often, well inside read timeouts


@dataclass(frozen=True)
class Fault:
    """How one route misbehaves: `kind` from `FAULTS`, for `times` calls (None: until cleared)."""

    kind: str
    times: int | None = None
    seconds: float = 30.0
    status: int = 500


@dataclass
class RouteStats:
    """What a route saw: calls, and streams opened, run to their end, or closed early."""

    calls: int = 0
    faults: int = 0
    streams_opened: int = 0
    streams_finished: int = 0
    streams_closed_early: int = 0


@dataclass
class FaultBook:
    """The faults in force and the per-route counters; safe to use from any thread."""

    faults: dict[str, Fault] = field(default_factory=dict)
    stats: dict[str, RouteStats] = field(
        default_factory=lambda: {route: RouteStats() for route in ROUTES}
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, route: str, fault: Fault) -> None:
        if route not in ROUTES:
            raise ValueError(f"unknown route {route!r}; routes are {ROUTES}")
        if fault.kind not in APPLICABLE[route]:
            raise ValueError(f"fault {fault.kind!r} does not apply to route {route!r}")
        with self.lock:
            self.faults[route] = fault

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def reset_stats(self) -> None:
        with self.lock:
            self.stats = {route: RouteStats() for route in ROUTES}

    def take(self, route: str) -> Fault | None:
        """Count a call on `route` and return the fault it must suffer, if any."""
        with self.lock:
            self.stats[route].calls += 1
            fault = self.faults.get(route)
            if fault is None:
                return None
            self.stats[route].faults += 1
            if fault.times is not None:
                if fault.times <= 1:
                    del self.faults[route]
                else:
                    self.faults[route] = replace(fault, times=fault.times - 1)
            return fault

    def count(self, route: str, what: str) -> None:
        with self.lock:
            stats = self.stats[route]
            setattr(stats, what, getattr(stats, what) + 1)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "faults": {route: asdict(fault) for route, fault in self.faults.items()},
                "stats": {route: asdict(stats) for route, stats in self.stats.items()},
            }


# --------------------------------------------------------------------------- connections


def _transport(request: Request) -> asyncio.BaseTransport:
    # ASGI hides the socket; the uvicorn server that `serve_in_thread` and `main` record on
    # the app knows its connections, each with the client address the scope names.
    server = getattr(request.app.state, "uvicorn_server", None)
    client = tuple(request.scope.get("client") or ())
    for protocol in getattr(getattr(server, "server_state", None), "connections", ()):
        transport = getattr(protocol, "transport", None)
        # asyncio's or uvloop's transport (uvicorn picks uvloop when it is installed).
        if getattr(protocol, "client", None) == client and hasattr(transport, "abort"):
            return transport  # type: ignore[no-any-return]
    raise RuntimeError("cannot reach the connection: serve the app with serve_in_thread/main")


def reset_connection(request: Request) -> None:
    """Drop the client's TCP connection with a reset (RST), not an orderly close (FIN)."""
    transport = _transport(request)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def close_connection(request: Request) -> None:
    """Close the connection in order (what was written still arrives), mid-response."""
    _transport(request).close()


async def stall(request: Request, seconds: float) -> None:
    """Wait `seconds`, or until the client has gone away."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not await request.is_disconnected():
        await asyncio.sleep(0.05)


class ClosingStreamingResponse(StreamingResponse):
    """Closes its generator however the response ends, so stream counters settle at once."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def tracked(book: FaultBook, route: str, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async def stream() -> AsyncIterator[bytes]:
        book.count(route, "streams_opened")
        finished = False
        try:
            async for piece in body:
                yield piece
            finished = True
        finally:
            book.count(route, "streams_finished" if finished else "streams_closed_early")

    return stream()


# --------------------------------------------------------------------------- faults


async def body_fault(
    fault: Fault, request: Request, book: FaultBook, route: str, good: bytes
) -> Response | None:
    """The response a faulty non-streamed route gives instead of `good`, or None for `slow`
    (after the stall the route answers normally)."""
    if fault.kind == "slow":
        await stall(request, fault.seconds)
        return None
    if fault.kind == "http_error":
        error = {"error": {"message": "injected fault", "type": "server_error"}}
        return JSONResponse(error, status_code=fault.status)
    if fault.kind == "reset":
        reset_connection(request)
        await stall(request, 5.0)
        return Response(status_code=204)  # never sent: the connection is gone
    if fault.kind == "malformed":
        return Response(MALFORMED_BODY, media_type="application/json")

    async def truncated() -> AsyncIterator[bytes]:
        yield good[: len(good) // 2]
        await asyncio.sleep(0.05)  # let the half go out before the connection closes
        close_connection(request)
        await stall(request, 5.0)

    async def endless() -> AsyncIterator[bytes]:
        yield good[:1]
        while True:
            await asyncio.sleep(TRICKLE_SECONDS)
            yield b" "

    if fault.kind == "truncated":
        headers = {"content-length": str(len(good))}
        body = tracked(book, route, truncated())
        return ClosingStreamingResponse(body, media_type="application/json", headers=headers)
    if fault.kind == "endless":
        body = tracked(book, route, endless())
        return ClosingStreamingResponse(body, media_type="application/json")
    raise AssertionError(f"unhandled fault {fault.kind!r}")
