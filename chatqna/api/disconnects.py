"""Work a request does only while its client is still there.

Starlette does not cancel a handler when its client goes away: only a streaming response
listens for `http.disconnect`, and only once it sends. A chat that is not streamed (the
default of `/v1/chat/completions`), or one still condensing, retrieving or waiting for the
LLM's first token, would otherwise run to its end for nobody, holding an LLM slot and a
place among the chats in flight. `while_connected` runs such work beside a listener on the
request's ASGI `receive` and cancels it when the client disconnects first.

`ClientPresence` notes that a client has left while something else listens (Starlette's
streaming response) or sends: the request metrics count such a request as 499, and a turn
told so ends its spans as one its client left rather than as failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.types import Message, Receive, Send

T = TypeVar("T")

# nginx's code for "the client closed the request": nobody reads it but the request metrics.
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnected(Exception):
    """The client went away before the work was done; the work was cancelled."""


async def _disconnect(receive: Receive) -> None:
    """Return once the client disconnects (the request's body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientPresence:
    """Whether the client of one request has left, seen on the way through its `receive`
    and `send`: an `http.disconnect` came, or a send failed with `OSError` (an ASGI 2.4
    server's way to say the client has gone; an older one drops the send and leaves the
    news to `receive`). `on_leave` runs once, as soon as the departure is seen, before the
    listener that saw it acts on it (Starlette cancels the stream it was sending)."""

    def __init__(
        self, receive: Receive, send: Send, on_leave: Callable[[], None] | None = None
    ) -> None:
        self._receive = receive
        self._send = send
        self._on_leave = on_leave
        self.left = False

    def leave(self) -> None:
        if self.left:
            return
        self.left = True
        if self._on_leave is not None:
            self._on_leave()

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.leave()
        return message

    async def send(self, message: Message) -> None:
        try:
            await self._send(message)
        except OSError:
            self.leave()
            raise


async def while_connected(
    receive: Receive, work: Awaitable[T], on_leave: Callable[[], None] | None = None
) -> T:
    """`work`'s result, unless the client disconnects first: then `on_leave` runs, `work` is
    cancelled (and waited for) and `ClientDisconnected` is raised."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
        if listener.done() and not task.done() and on_leave is not None:
            on_leave()
    finally:  # when this handler is cancelled too: neither task outlives it
        listener.cancel()
        if not task.done():
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task, listener})
        if not listener.cancelled():
            listener.exception()  # a listener that failed counts as the client gone
    if task.cancelled() and not listener.cancelled():
        raise ClientDisconnected("the client disconnected before the answer was ready")
    return task.result()
