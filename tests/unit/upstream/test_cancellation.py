"""How a cancellation of the caller reaches the work it runs: a close runs to its end, and
other work is cancelled as an anyio cancel scope cancels it, so that anyio's cancel shields
(httpcore2's around its connection-state changes) hold. The pool itself, on real sockets:
`tests/integration/test_pooled_connections.py`."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from chatqna.upstream.cancellation import scoped, to_completion

pytestmark = pytest.mark.anyio


async def started(work: asyncio.Future[object]) -> None:
    for _ in range(3):  # the caller's task, then the work's own, reach their waits
        await asyncio.sleep(0)
    assert not work.done()


async def test_a_close_runs_to_its_end_however_often_its_caller_is_cancelled() -> None:
    gate, steps = asyncio.Event(), []

    async def close() -> None:
        await gate.wait()
        steps.append("closed")

    caller = asyncio.ensure_future(to_completion(close))
    await started(caller)
    caller.cancel()
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0)
    assert not caller.done() and steps == []
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert steps == ["closed"]


async def test_work_gives_its_result_and_its_errors_as_they_are() -> None:
    async def answer() -> str:
        await asyncio.sleep(0)
        return "answer"

    async def fail() -> str:
        raise ValueError("no answer")

    async def undo(_: str) -> None:
        raise AssertionError("nothing to undo")

    assert await scoped(answer, undo) == "answer"
    with pytest.raises(ValueError, match="no answer"):
        await scoped(fail, undo)


async def test_a_cancelled_caller_cancels_its_work_at_once_where_it_waits() -> None:
    seen = []

    async def wait() -> str:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            seen.append("cancelled")
            raise
        return "never"

    async def undo(_: str) -> None:
        raise AssertionError("nothing to undo")

    caller = asyncio.ensure_future(scoped(wait, undo))
    await started(caller)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert seen == ["cancelled"]


async def test_a_shielded_step_of_the_work_is_never_cut_short_and_its_result_is_undone() -> None:
    """What a native `Task.cancel()` of the work's own task would break into: a step under
    an anyio shield (httpcore2 taking a connection into use). It finishes; the result the
    work then gives (a response) is handed to `undo`, and the caller is cancelled."""
    gate, steps, undone = asyncio.Event(), [], []

    async def open_() -> str:
        with anyio.CancelScope(shield=True):
            await gate.wait()
            await asyncio.sleep(0)  # the lock's checkpoint, where a native cancel lands
            steps.append("in use")
        return "response"

    async def close(response: str) -> None:
        await asyncio.sleep(0)
        undone.append(response)

    caller = asyncio.ensure_future(scoped(open_, close))
    await started(caller)
    caller.cancel()
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert steps == ["in use"]
    assert undone == ["response"]
