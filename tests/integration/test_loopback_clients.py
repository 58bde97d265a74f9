"""The clients of our own service (`chatqna ask`, `chatqna bench --service`) reach it on
loopback straight, with a proxy in `HTTP_PROXY`: a loopback forward proxy records every
request it gets, and must get none of theirs, while an ordinary httpx2 client goes through it.
Real sockets on 127.0.0.1, in this process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
from typer.testing import CliRunner

from chatqna import cli
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.service import run_against_service
from tests.standins.hostile import ForwardProxy, read_request, running
from tests.unit.evaluation.test_dataset import write_dataset

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
ANSWER = b'data: {"choices": [{"index": 0, "delta": {"content": "Straight."}}]}\n\ndata: [DONE]\n\n'


@dataclass
class ChatService:
    """Stands in for `chatqna serve`: a streamed request gets one short answer, any other
    a 502 page (enough for a client to have reached it); `seen` keeps each request line."""

    seen: list[bytes] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, body = await read_request(reader)
        self.seen.append(line)
        if json.loads(body or b"{}").get("stream"):
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(ANSWER))
            writer.write(ANSWER)
        else:
            writer.write(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        await writer.drain()
        writer.close()


@pytest.fixture
def proxied(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, ChatService, ForwardProxy]]:
    """A service on loopback, and `HTTP_PROXY` naming a proxy on loopback (no `NO_PROXY`)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    service, proxy = ChatService(), ForwardProxy()
    with running(service) as url, running(proxy) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        yield url, service, proxy


def test_the_proxy_carries_an_ordinary_client_to_loopback(
    proxied: tuple[str, ChatService, ForwardProxy],
) -> None:
    """The set-up proves something: httpx2 itself exempts no loopback address."""
    url, service, proxy = proxied
    with httpx2.Client() as client:
        client.post(f"{url}/v1/chatqna", json={"stream": True})
    assert [line.split(b" ")[1].decode() for line in proxy.seen] == [f"{url}/v1/chatqna"]
    assert len(service.seen) == 1  # forwarded


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_ask_reaches_its_service_on_loopback_past_the_proxy(
    proxied: tuple[str, ChatService, ForwardProxy], host: str
) -> None:
    url, service, proxy = proxied
    url = url.replace("127.0.0.1", host)
    result = CliRunner().invoke(cli.app, ["ask", "--url", url, "q"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "Straight.\n"
    assert proxy.seen == []
    assert service.seen == [b"POST /v1/chatqna HTTP/1.1"]


def test_bench_against_a_service_on_loopback_goes_past_the_proxy(
    proxied: tuple[str, ChatService, ForwardProxy], tmp_path: Path
) -> None:
    url, service, proxy = proxied
    dataset = load_dataset(write_dataset(tmp_path))
    with pytest.raises(httpx2.HTTPStatusError, match="502"):
        asyncio.run(run_against_service(dataset, url, ingest=False, samples=10))
    assert proxy.seen == []
    assert service.seen[:1] == [b"POST /v1/chatqna HTTP/1.1"]
