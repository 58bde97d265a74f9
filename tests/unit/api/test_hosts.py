"""`HostGuard` on its own: Starlette's host matching, refused with the error envelope."""

from __future__ import annotations

import httpx2
import pytest
from starlette.types import Message, Receive, Scope, Send

from chatqna.api.hosts import HostGuard

pytestmark = pytest.mark.anyio

ALLOWED = ["chat.example.com", "*.internal.example", "[::1]", "127.0.0.1"]
REFUSAL = {
    "error": "invalid_host",
    "message": "The service does not answer to the host this request names in its Host "
    "header (CHATQNA_ALLOWED_HOSTS lists those it does).",
}


async def accepted(scope: Scope, receive: Receive, send: Send) -> None:
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def post(host: str, allowed: list[str] = ALLOWED, body: bytes = b"") -> httpx2.Response:
    """A POST sent with `Host: host` through a guard that answers to `allowed`."""
    transport = httpx2.ASGITransport(app=HostGuard(accepted, allowed_hosts=allowed))
    async with httpx2.AsyncClient(transport=transport, base_url="http://placeholder") as client:
        return await client.post("/v1/chatqna", headers={"Host": host}, content=body)


@pytest.mark.parametrize(
    "host",
    [
        "chat.example.com",
        "Chat.Example.COM:8080",  # any port, any case
        "a.internal.example",
        "b.a.internal.example:8888",
        "[::1]:8888",
        "127.0.0.1",
    ],
)
async def test_a_host_it_answers_to_goes_through(host: str) -> None:
    assert (await post(host)).status_code == 204


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "chat.example.com.evil.example",
        "internal.example",  # `*.internal.example` names its subdomains only
        "[::2]:8888",
        "127.0.0.2",
        "chat.example.com:port",  # malformed
        "",
    ],
)
async def test_any_other_host_is_refused_with_the_envelope(host: str) -> None:
    response = await post(host)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json() == REFUSAL


async def test_a_star_answers_every_host() -> None:
    assert (await post("anything.example:1", ["*"])).status_code == 204


async def test_a_refused_body_closes_the_connection() -> None:
    response = await post("evil.example", body=b"{}")
    assert response.status_code == 400
    assert response.headers["connection"] == "close"


async def run(scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "inner.reached"})

    await HostGuard(inner, allowed_hosts=ALLOWED)(scope, receive, send)
    return sent


async def test_a_websocket_for_another_host_is_denied_as_starlette_denies_it() -> None:
    """As an HTTP response on the handshake (the ASGI denial response), with the envelope."""
    scope = {"type": "websocket", "path": "/ws", "headers": [(b"host", b"evil.example")]}
    sent = await run(scope)
    assert [message["type"] for message in sent] == [
        "websocket.http.response.start",
        "websocket.http.response.body",
    ]
    assert sent[0]["status"] == 400
    answered = {"type": "websocket", "path": "/ws", "headers": [(b"host", b"chat.example.com")]}
    assert await run(answered) == [{"type": "inner.reached"}]


async def test_a_lifespan_passes_unchecked() -> None:
    assert await run({"type": "lifespan"}) == [{"type": "inner.reached"}]
