"""The fast stand-ins (`tests.standins.fast_servers`) answer as the FastAPI ones do.

Both run side by side: the FastAPI app in a thread, the fast one as its own process started
the way the benchmarks start it (`standin_argv`). The same requests must get the same
status, headers (but `date`), bytes and chunk framing; the fast server also keeps
connections alive, answers pipelined requests in order, and says 404, 405 or 400.
"""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx2
import pytest

from tests.integration.conftest import REPO, clean_env
from tests.sse_events import parse_events
from tests.standins import fast_servers
from tests.standins.servers import create_standin_app, free_port, serve_in_thread

pytestmark = pytest.mark.slow

TOKENS = 5
FAST = "tests.standins.fast_servers"
QUESTION = "How long do you keep my data after I cancel?"
CHAT = {"model": "standin", "messages": [{"role": "user", "content": QUESTION}]}
# (method, path, JSON body or None): every route both stand-ins serve.
SAME_ANSWERS: list[tuple[str, str, Any]] = [
    ("GET", "/health", None),
    ("GET", "/v1/ready", None),
    ("GET", "/info", None),
    ("GET", "/v1/models", None),
    ("GET", "/condense/v1/models", None),
    ("POST", "/v1/dataprep/get", None),
    ("POST", "/v1/embeddings", {"input": ["How do I export my data?", "Is SSO included?"]}),
    ("POST", "/v1/embeddings", {"input": QUESTION}),
    ("POST", "/rerank", {"query": QUESTION, "texts": ["keep data 30 days", "sso", "my data"]}),
    ("POST", "/v1/retrieval", {"text": QUESTION, "embedding": [0.1, 0.2], "k": 3}),
    ("POST", "/v1/retrieval", {"text": "refunds for annual plans"}),
    ("GET", "/no/such/route", None),
    ("POST", "/health", None),  # 405
    ("GET", "/v1/embeddings", None),  # 405
    ("HEAD", "/health", None),  # 405, and no body
]


def _load_chats() -> ModuleType:
    """The benchmarks' process helpers (a script beside the benchmarks, not a package)."""
    path = REPO / "benchmarks" / "load_chats.py"
    spec = importlib.util.spec_from_file_location("load_chats", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["load_chats"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def load_chats() -> ModuleType:
    return _load_chats()


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    with serve_in_thread(create_standin_app(tokens=TOKENS)) as url:
        yield url


def _fast_process(load_chats: ModuleType, log: Path, options: dict[str, Any]) -> Iterator[str]:
    port = free_port()
    argv = load_chats.standin_argv(port, options, FAST)
    process = load_chats.start_process(
        "fast-standins", argv, clean_env(), port, log.parent, ready_path="/health", timeout=30
    )
    try:
        yield process.url
    finally:
        process.stop()


@pytest.fixture(scope="module")
def fast_url(load_chats: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("fast") / "fast.log"
    yield from _fast_process(load_chats, log, {"tokens": TOKENS})


@pytest.fixture(scope="module")
def paced_url(load_chats: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fast stand-ins with a delay and a token interval: answers go through a task."""
    log = tmp_path_factory.mktemp("paced") / "paced.log"
    options = {"tokens": TOKENS, "delay": 0.05, "token_interval": 0.01}
    yield from _fast_process(load_chats, log, options)


def _call(url: str, method: str, path: str, body: Any) -> httpx2.Response:
    content = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"content-type": "application/json"}
    return httpx2.request(method, url + path, content=content, headers=headers, timeout=10)


def _headers(response: httpx2.Response) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in response.headers.raw if k.lower() != b"date"]


@pytest.mark.parametrize(("method", "path", "body"), SAME_ANSWERS)
def test_same_status_headers_and_bytes(
    app_url: str, fast_url: str, method: str, path: str, body: Any
) -> None:
    theirs, ours = (_call(url, method, path, body) for url in (app_url, fast_url))
    assert ours.status_code == theirs.status_code
    assert _headers(ours) == _headers(theirs)
    assert ours.content == theirs.content
    if theirs.status_code == 200:
        assert ours.json() == theirs.json()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/condense/v1/chat/completions"])
def test_same_completion_but_the_clock(app_url: str, fast_url: str, route: str) -> None:
    condense = {"response_format": {"type": "json_object"}} if "condense" in route else {}
    body = CHAT | condense
    theirs, ours = (_call(url, "POST", route, body) for url in (app_url, fast_url))
    assert (ours.status_code, _headers(ours)) == (theirs.status_code, _headers(theirs))
    mine, reference = ours.json(), theirs.json()
    assert abs(mine.pop("created") - time.time()) < 60
    reference.pop("created")
    assert mine == reference
    assert mine["choices"][0]["message"]["content"]


def _raw_chunks(url: str, path: str, body: Any) -> tuple[bytes, list[bytes]]:
    """A chunked response read off the socket: its head and its chunks, as framed."""
    port = int(url.rsplit(":", 1)[1])
    payload = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode() + payload
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while data := sock.recv(65536):
            received += data
    head, _, rest = received.partition(b"\r\n\r\n")
    chunks = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]
        if size == 0:
            assert rest == b""
            return head, chunks


def test_same_stream_frame_by_frame(app_url: str, fast_url: str) -> None:
    body = CHAT | {"stream": True, "max_tokens": TOKENS}
    theirs, ours = (_call(url, "POST", "/v1/chat/completions", body) for url in (app_url, fast_url))
    assert ours.status_code == theirs.status_code == 200
    assert ours.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert _headers(ours) == _headers(theirs)
    events = parse_events(ours.content)
    assert events == parse_events(theirs.content)
    assert [e.is_done for e in events] == [False] * (TOKENS + 1) + [True]
    assert ours.content == theirs.content
    # One chunk per token frame, the last one carrying `[DONE]`, then the empty chunk.
    (our_head, our_chunks), (_, their_chunks) = (
        _raw_chunks(url, "/v1/chat/completions", body) for url in (fast_url, app_url)
    )
    assert b"transfer-encoding: chunked" in our_head
    assert our_chunks == their_chunks
    assert len(our_chunks) == TOKENS + 2 and our_chunks[-1] == b""
    assert all(chunk.endswith(b"\n\n") for chunk in our_chunks[:-1])


def test_chunked_request_body_is_decoded(app_url: str, fast_url: str) -> None:
    pieces = [b'{"query": "keep my ', b'data", "texts": ["data kept", "sso"]}']
    theirs, ours = (
        httpx2.post(url + "/rerank", content=iter(pieces), timeout=10)
        for url in (app_url, fast_url)
    )
    assert ours.request.headers["transfer-encoding"] == "chunked"
    assert (ours.status_code, ours.content) == (theirs.status_code, theirs.content)


def test_one_connection_serves_many_requests(fast_url: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", int(fast_url.rsplit(":", 1)[1]))
    calls: list[tuple[str, str, Any]] = [
        ("GET", "/health", None),
        ("HEAD", "/health", None),  # a head without a body: the next answer must parse
        ("POST", "/v1/embeddings", {"input": "a b"}),
        ("POST", "/v1/chat/completions", CHAT | {"stream": True}),
        ("POST", "/v1/embeddings", "{not json"),  # a 400 keeps the connection
        ("POST", "/v1/chat/completions", CHAT),
    ]
    sockets = []
    statuses = []
    for method, path, body in calls:
        payload = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        connection.request(method, path, body=payload)
        response = connection.getresponse()
        response.read()
        statuses.append(response.status)
        sockets.append(connection.sock)
    connection.close()
    assert statuses == [200, 405, 200, 200, 400, 200]
    assert sockets[0] is not None and all(sock is sockets[0] for sock in sockets)


def test_connection_close_is_honoured(fast_url: str) -> None:
    port = int(fast_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = b""
        while data := sock.recv(65536):  # ends: the server closes
            received += data
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nconnection: close\r\n" in received


def test_a_head_request_gets_no_body(fast_url: str) -> None:
    with socket.create_connection(("127.0.0.1", int(fast_url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(
            b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        received = b""
        while data := s.recv(65536):
            received += data
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ") and b"content-length: 31" in head
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n") and rest.endswith(b'\r\n\r\n{"status":"ok"}')


@pytest.mark.parametrize("server", ["fast", "paced"])
def test_pipelined_requests_are_answered_in_order(
    fast_url: str, paced_url: str, server: str
) -> None:
    url = fast_url if server == "fast" else paced_url
    chat = json.dumps(CHAT | {"stream": True}).encode()
    rerank = json.dumps({"query": "a", "texts": ["a"]}).encode()
    requests = [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        % (len(chat), chat),
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (len(rerank), rerank),
    ]
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(b"".join(requests))  # all at once, before any answer
        received = b""
        while data := sock.recv(65536):
            received += data
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 3
    done, health, ranked = (
        received.index(marker)
        for marker in (b"data: [DONE]", b'{"status":"ok"}', b'[{"index": 0, "score"')
    )
    assert done < health < ranked


def test_delay_and_token_interval_pace_the_same_stream(app_url: str, paced_url: str) -> None:
    body = CHAT | {"stream": True}
    started = time.perf_counter()
    ours = _call(paced_url, "POST", "/v1/chat/completions", body)
    took = time.perf_counter() - started
    theirs = _call(app_url, "POST", "/v1/chat/completions", body)
    assert ours.content == theirs.content
    assert took >= 0.05 + TOKENS * 0.01
    started = time.perf_counter()
    assert _call(paced_url, "POST", "/v1/embeddings", {"input": "x"}).status_code == 200
    assert _call(paced_url, "GET", "/health", None).status_code == 200  # not delayed
    assert time.perf_counter() - started >= 0.05


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", b"{not json"),
        ("/v1/embeddings", b'{"text": "no input field"}'),
        ("/rerank", b'{"query": "q"}'),
        ("/v1/retrieval", b"[1, 2]"),
        ("/v1/chat/completions", b""),
    ],
)
def test_bad_bodies_are_400(fast_url: str, path: str, body: bytes) -> None:
    response = httpx2.post(
        fast_url + path, content=body, headers={"content-type": "application/json"}, timeout=10
    )
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json()["detail"]


def test_a_request_that_is_not_http_is_400(fast_url: str) -> None:
    with socket.create_connection(("127.0.0.1", int(fast_url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        received = s.recv(65536)
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n")


def test_caches_stay_bounded() -> None:
    routes = asyncio.run(fast_servers.StandinRoutes.create(tokens=TOKENS, cache_size=2))
    answers = [
        routes.answer(b"POST", b"/v1/embeddings", json.dumps({"input": text}).encode())
        for text in ("one", "two", "three", "one")
    ]
    assert [a.status for a in answers] == [200] * 4
    assert answers[0].body == answers[3].body  # recomputed after eviction, the same bytes
    assert len(routes.answers) == 2 and len(routes.vectors) == 2


def test_fault_options_are_refused(load_chats: ModuleType) -> None:
    with pytest.raises(SystemExit, match="--fault"):
        load_chats.standin_argv(free_port(), {"fault": "chat:reset"}, FAST)


def test_listens_on_loopback_only() -> None:
    run = subprocess.run(
        [sys.executable, "-m", FAST, "--port", str(free_port()), "--host", "0.0.0.0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "loopback" in run.stderr
