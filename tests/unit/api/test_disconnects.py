"""`while_connected`: work that runs only while its client is there; `ClientPresence`:
whether a client has left, seen on its way through `receive` and `send`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chatqna.api.disconnects import ClientDisconnected, ClientPresence, while_connected

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
    seen: list[bool] = []

    def leave() -> None:
        seen.append(work.cancelled)

    pending = asyncio.ensure_future(while_connected(client.receive, work.run(), leave))
    await work.started.wait()
    client.gone.set()
    with pytest.raises(ClientDisconnected):
        await pending
    assert work.cancelled
    assert seen == [False], "told once, before the work is cancelled"


async def test_work_done_first_is_no_departure() -> None:
    client, work = Client(), Work()
    work.release.set()
    seen: list[str] = []
    assert await while_connected(client.receive, work.run(), lambda: seen.append("left"))
    assert seen == []


async def test_presence_sees_a_disconnect_on_receive_once() -> None:
    client = Client({"type": "http.request", "body": b"", "more_body": False})
    seen: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        return None

    presence = ClientPresence(client.receive, send, lambda: seen.append("left"))
    assert (await presence.receive())["type"] == "http.request"
    assert not presence.left and seen == []
    client.gone.set()
    for _ in range(2):
        assert (await presence.receive())["type"] == "http.disconnect"
    assert presence.left and seen == ["left"]


async def test_presence_sees_a_send_that_fails_with_os_error() -> None:
    seen: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the client is gone")

    presence = ClientPresence(Client().receive, send, lambda: seen.append("left"))
    await presence.send({"type": "http.response.start", "status": 200})
    assert not presence.left
    with pytest.raises(OSError, match="gone"):
        await presence.send({"type": "http.response.body", "body": b"x"})
    assert presence.left and seen == ["left"]


async def test_presence_does_not_take_other_send_errors_for_a_departure() -> None:
    async def send(message: dict[str, Any]) -> None:
        raise RuntimeError("a bug")

    presence = ClientPresence(Client().receive, send)
    with pytest.raises(RuntimeError):
        await presence.send({"type": "http.response.start", "status": 200})
    assert not presence.left


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
