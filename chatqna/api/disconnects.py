"""Work a request does only while its client is still there.

Starlette does not cancel a handler when its client goes away: only a streaming response
listens for `http.disconnect`, and only once it sends. A chat that is not streamed (the
default of `/v1/chat/completions`), or one still condensing, retrieving or waiting for the
LLM's first token, would otherwise run to its end for nobody, holding an LLM slot and a
place among the chats in flight. `while_connected` runs such work beside a listener on the
request's ASGI `receive` and cancels it when the client disconnects first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import anyio
from starlette.types import Receive

T = TypeVar("T")

# nginx's code for "the client closed the request": nobody reads it but the request metrics.
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnected(Exception):
    """The client went away before the work was done; the work was cancelled."""


async def _disconnect(receive: Receive) -> None:
    """Return once the client disconnects (the request's body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_connected(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result, unless the client disconnects first: then `work` is cancelled (and
    waited for) and `ClientDisconnected` is raised."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
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
