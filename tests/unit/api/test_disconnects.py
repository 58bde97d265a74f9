"""`while_connected`: work that runs only while its client is there."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chatqna.api.disconnects import ClientDisconnected, while_connected

pytestmark = pytest.mark.anyio


class Client:
    """An ASGI `receive` whose client leaves when the test says so."""

    def __init__(self, *before: dict[str, Any]) -> None:
        self.gone = asyncio.Event()
        self.before = list(before)
        self.calls = 0

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        if self.before:
            return self.before.pop(0)
        await self.gone.wait()
        return {"type": "http.disconnect"}


class Work:
    """Work that waits until released, and records whether it was cancelled."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self) -> str:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "answer"


async def test_work_done_while_the_client_stays_returns_its_result() -> None:
    client, work = Client(), Work()
    work.release.set()
    assert await while_connected(client.receive, work.run()) == "answer"
    assert not work.cancelled


async def test_a_client_gone_first_cancels_the_work() -> None:
    client, work = Client(), Work()
    pending = asyncio.ensure_future(while_connected(client.receive, work.run()))
    await work.started.wait()
    client.gone.set()
    with pytest.raises(ClientDisconnected):
        await pending
    assert work.cancelled


async def test_messages_other_than_a_disconnect_are_not_one() -> None:
    client = Client({"type": "http.request", "body": b"", "more_body": False})
    work = Work()
    pending = asyncio.ensure_future(while_connected(client.receive, work.run()))
    await work.started.wait()
    await asyncio.sleep(0)
    assert client.calls == 2 and not pending.done()  # still listening
    work.release.set()
    assert await pending == "answer"


async def test_the_works_own_error_is_raised_as_it_is() -> None:
    async def failing() -> None:
        raise ValueError("upstream said no")

    with pytest.raises(ValueError, match="upstream said no"):
        await while_connected(Client().receive, failing())


async def test_a_cancelled_handler_cancels_its_work_and_leaves_no_task() -> None:
    client, work = Client(), Work()
    before = asyncio.all_tasks()
    pending = asyncio.ensure_future(while_connected(client.receive, work.run()))
    await work.started.wait()
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert work.cancelled
    assert asyncio.all_tasks() - before == set()


async def test_a_receive_that_fails_counts_as_the_client_gone() -> None:
    work = Work()

    async def broken() -> dict[str, Any]:
        await work.started.wait()
        raise OSError("connection lost")

    with pytest.raises(ClientDisconnected):
        await while_connected(broken, work.run())
    assert work.cancelled
