"""How a cancellation reaches httpcore2 without costing the pool a connection.

httpcore2 (2.17.0, as httpcore 1.0.9 before it) guards the steps that change a pooled
connection's state, taking a new connection into use and giving one back or closing it,
with anyio's cancel shields. Those hold back an anyio cancellation, but not asyncio's own
`Task.cancel()`, which is what an `asyncio.timeout`, `asyncio.wait_for` or a disconnected
client's cancelled task delivers. One that lands inside such a step (at the `await` in
httpcore2's connection-state lock) leaves the connection neither pooled nor closed: it
holds one of the pool's `max_connections` until the client is closed, and once all are held
every call waits for a slot until its timeout (encode/httpcore#1093 and #1115,
encode/httpx#3782; `tests/integration/test_pooled_connections.py` cancels calls at every
step of their way).

So the session runs those steps here, each in a task of its own:

- `scoped`: sending a request and awaiting its headers, and for a whole body its read too,
  cancelled, when the caller is, by cancelling an anyio cancel scope around it: httpcore2's
  shields then hold, and the wait for the headers (a whole generation, for an answer that
  is not streamed) still ends at once;
- `to_completion`: closing a response, which nothing cancels; the caller waits for it even
  when cancelled. A close never waits on the network (httpcore2 closes the socket, TLS
  included, without a graceful shutdown), so it cannot hang on a failing upstream.

A streamed body is read by its caller, where a task per read would cost more than the read
(about 20 µs a chunk). A cancellation of a read is safe on its own: httpcore2 closes the
response, shielded, before it passes the cancellation on. Only a cancellation that lands
inside that close, just after a read failed (a reset mid-body) or was cancelled already,
still leaks the connection there (encode/httpx#3782).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


async def _finished(task: asyncio.Future[Any]) -> None:
    """Wait until `task` is done, whatever cancels the caller meanwhile."""
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            continue  # the caller raises its cancellation once `task` is done


async def to_completion(work: Callable[[], Awaitable[None]]) -> None:
    """Run `work` to its end; a cancellation of the caller meanwhile is raised after it."""
    task = asyncio.ensure_future(work())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await _finished(task)
        if not task.cancelled():
            task.exception()  # the cancellation is what the caller gets
        raise


async def scoped(work: Callable[[], Awaitable[T]], undo: Callable[[T], Awaitable[None]]) -> T:
    """`work`'s result. A cancellation of the caller cancels `work` as an anyio cancel
    scope does, and waits for it to stop; a result it produced all the same goes to `undo`
    (run to its end), and the cancellation is raised."""
    scope = anyio.CancelScope()

    async def run() -> list[T]:
        results: list[T] = []
        with scope:  # a cancellation of this scope ends here, with no result
            results.append(await work())
        return results

    task = asyncio.ensure_future(run())
    try:
        return (await asyncio.shield(task))[0]
    except asyncio.CancelledError:
        if not task.done():
            scope.cancel()
            await _finished(task)
        if not task.cancelled() and task.exception() is None and task.result():
            await to_completion(functools.partial(undo, task.result()[0]))
        raise
