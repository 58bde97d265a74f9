"""Stand-in upstreams on loopback speaking TEI's, OpenAI's and OPEA's retriever wire formats.

For benchmarks and end-to-end tests that need an upstream whose speed and failures are
known. One app serves every upstream role:

| route        | path                                              | wire format          |
|--------------|---------------------------------------------------|----------------------|
| `embeddings` | `POST /v1/embeddings`                             | TEI (OpenAI-style)   |
| `info`       | `GET /info` (the model served: `model_id`)        | TEI                  |
| `rerank`     | `POST /rerank`                                    | TEI                  |
| `chat`       | `POST /v1/chat/completions`                       | OpenAI, streamed too |
| `condense`   | `POST /condense/v1/chat/completions`              | OpenAI (a 2nd model) |
| `retrieval`  | `POST /v1/retrieval`                              | OPEA retriever       |

Vectors are feature-hashed (texts sharing words get similar vectors); the chat model
streams a fixed reply `tokens` pieces long, `token_interval` seconds apart, after `delay`
seconds; asked for a `standalone_query` JSON reply (condense), it returns the latest message.

Faults, chosen at run time per route through `POST /_standin/fault` with
`{"route", "fault", "times"?, "seconds"?, "status"?}` (or `app.state.faults.set(...)`, or
`--fault route:fault` on the command line): `slow` (stall `seconds` before answering),
`http_error` (answer `status`, 500 by default), `reset` (reset the TCP connection; streams
first send two tokens), `truncated` (cut the body short; streams end mid-JSON without
`[DONE]`), `malformed` (a body or a stream chunk that is not JSON), `wrong_dimension`
(embeddings half as wide) and `endless` (a body or a stream that never ends). `times`
limits a fault to that many calls. `DELETE /_standin/fault` clears every fault;
`GET /_standin/stats` counts calls and streams per route, including streams the client
closed before their end (`tests.standins.faults` holds the fault machinery). The
stand-ins run in a thread of the calling process (`serve_in_thread`) or as their own
process (`python -m tests.standins.servers`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tests.standins.faults import (
    APPLICABLE,
    FAULTS,
    ROUTES,
    ClosingStreamingResponse,
    Fault,
    FaultBook,
    body_fault,
    reset_connection,
    stall,
    tracked,
)

__all__ = ["Fault", "FaultBook", "create_standin_app", "free_port", "serve_in_thread", "tei_info"]

DIMENSION = 64
MODEL_ID = "standin/feature-hashing"

DOCUMENTS = [
    ("export.md", "Export", "Open Settings and choose Export to download your workspace data."),
    ("retention.md", "Retention", "Data is kept for 30 days after cancellation, then deleted."),
    ("refunds.md", "Refunds", "Annual plans can be refunded in full within 30 days."),
    ("sso.md", "Single sign-on", "Single sign-on is part of the Enterprise plan."),
    ("billing.md", "Billing", "Monthly plans are billed on the first day of each month."),
]


def hashed_vector(text: str, dimension: int = DIMENSION) -> list[float]:
    row = np.zeros(dimension, dtype=np.float32)
    for token in text.lower().split() or ["<empty>"]:
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        row[int.from_bytes(digest, "little") % dimension] += 1.0
    row /= np.linalg.norm(row)
    return [float(x) for x in row]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


@dataclass(frozen=True)
class ChatModel:
    """The stand-in chat model: `tokens` pieces, `token_interval` seconds apart."""

    tokens: int
    token_interval: float

    def pieces(self) -> list[str]:
        return [f"word{i} " for i in range(self.tokens)]

    async def stream(self) -> AsyncIterator[bytes]:
        for piece in self.pieces():
            yield _chunk({"content": piece})
            if self.token_interval > 0:
                await asyncio.sleep(self.token_interval)
        yield _chunk({}, "stop") + b"data: [DONE]\n\n"

    async def faulty_stream(self, fault: Fault, request: Request) -> AsyncIterator[bytes]:
        for piece in self.pieces()[:2]:
            yield _chunk({"content": piece})
        if fault.kind == "reset":
            await asyncio.sleep(0.05)  # let the two tokens go out first
            reset_connection(request)
            await stall(request, 5.0)
        elif fault.kind == "truncated":
            yield b'data: {"object": "chat.completion.chunk", "choi'
        elif fault.kind == "malformed":
            yield b"data: this is not json\n\n"
            yield b"data: [DONE]\n\n"
        elif fault.kind == "endless":
            interval = self.token_interval if self.token_interval > 0 else 0.02
            while True:
                yield _chunk({"content": "again "})
                await asyncio.sleep(interval)

    def reply(self, body: dict[str, Any]) -> str:
        if body.get("response_format"):
            # The condense rewrite: hand the latest message back as the standalone query.
            last = str(body["messages"][-1]["content"])
            latest = last.rsplit("Latest message:", 1)[-1].strip()
            return json.dumps({"standalone_query": latest})
        return "".join(self.pieces())

    def completion(self, body: dict[str, Any]) -> bytes:
        return json.dumps(
            {
                "id": "standin",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": self.reply(body)},
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": self.tokens},
            }
        ).encode()


# --------------------------------------------------------------------------- the app


def _retrieved(text: str, k: int) -> dict[str, Any]:
    words = set(text.lower().split())
    scored = sorted(
        (
            (len(words & set(body.lower().split())) / (1 + len(words)), position)
            for position, (_, _, body) in enumerate(DOCUMENTS)
        ),
        key=lambda item: (-item[0], item[1]),
    )
    docs = []
    for score, position in scored[:k]:
        source, title, body = DOCUMENTS[position]
        docs.append(
            {
                "id": f"{source}#0",
                "text": body,
                "score": score,
                "metadata": {"source": source, "title": title, "chunk_index": 0},
            }
        )
    return {"retrieved_docs": docs}


def _add_control_routes(app: FastAPI, book: FaultBook) -> None:
    @app.post("/_standin/fault")
    async def set_fault(request: Request) -> JSONResponse:
        body = await request.json()
        try:
            fault = Fault(
                kind=str(body["fault"]),
                times=body.get("times"),
                seconds=float(body.get("seconds", 30.0)),
                status=int(body.get("status", 500)),
            )
            book.set(str(body["route"]), fault)
        except (KeyError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(book.snapshot())

    @app.delete("/_standin/fault")
    async def clear_faults() -> dict[str, Any]:
        book.clear()
        return book.snapshot()

    @app.get("/_standin/stats")
    async def stats() -> dict[str, Any]:
        return book.snapshot()

    @app.delete("/_standin/stats")
    async def reset_stats() -> dict[str, Any]:
        book.reset_stats()
        return book.snapshot()


def tei_info(model_id: str = MODEL_ID) -> dict[str, Any]:
    """TEI's `GET /info` for the stand-in embedding model, in the shape of TEI's `Info`."""
    return {
        "model_id": model_id,
        "model_sha": None,
        "model_dtype": "float32",
        "model_type": {"embedding": {"pooling": "mean"}},
        "max_concurrent_requests": 512,
        "max_input_length": 512,
        "max_batch_tokens": 16384,
        "max_batch_requests": None,
        "max_client_batch_size": 32,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": "standin",
        "sha": None,
        "docker_label": None,
    }


def create_standin_app(
    *,
    delay: float = 0.0,
    tokens: int = 20,
    token_interval: float = 0.0,
    dimension: int = DIMENSION,
    model_id: str = MODEL_ID,
) -> FastAPI:
    """One app serving every upstream role (see the module docstring); faults start off.
    `model_id` is the embedding model `GET /info` names."""
    app = FastAPI()
    book = FaultBook()
    app.state.faults = book
    app.state.rerank_queries = []  # every /rerank query text, in arrival order
    model = ChatModel(tokens, token_interval)
    _add_control_routes(app, book)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return tei_info(model_id)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        sent = (await request.json())["input"]
        texts = [sent] if isinstance(sent, str) else sent
        fault = book.take("embeddings")
        width = max(2, dimension // 2) if fault and fault.kind == "wrong_dimension" else dimension
        await asyncio.sleep(delay)
        good = {
            "object": "list",
            "model": "standin",
            "data": [
                {"object": "embedding", "index": i, "embedding": hashed_vector(t, width)}
                for i, t in enumerate(texts)
            ],
        }
        return await _answer(request, book, "embeddings", fault, good)

    @app.post("/rerank")
    async def rerank(request: Request) -> Response:
        body = await request.json()
        app.state.rerank_queries.append(body["query"])
        fault = book.take("rerank")
        query = set(body["query"].lower().split())
        scores = [len(query & set(t.lower().split())) / (1 + len(query)) for t in body["texts"]]
        await asyncio.sleep(delay)
        good = sorted(
            ({"index": i, "score": s} for i, s in enumerate(scores)),
            key=lambda item: -item["score"],
        )
        return await _answer(request, book, "rerank", fault, good)

    @app.post("/v1/retrieval")
    async def retrieval(request: Request) -> Response:
        body = await request.json()
        fault = book.take("retrieval")
        await asyncio.sleep(delay)
        good = _retrieved(str(body.get("text", "")), int(body.get("k", 4)))
        return await _answer(request, book, "retrieval", fault, good)

    @app.post("/v1/dataprep/get")
    async def sources() -> list[dict[str, Any]]:
        return [{"name": source, "id": source, "chunks": 1} for source, _, _ in DOCUMENTS]

    for prefix, route in (("", "chat"), ("/condense", "condense")):
        _add_chat_routes(app, book, model, prefix, route, delay)
    return app


async def _answer(
    request: Request, book: FaultBook, route: str, fault: Fault | None, good: Any
) -> Response:
    body = json.dumps(good).encode()
    if fault is not None and fault.kind != "wrong_dimension":
        faulty = await body_fault(fault, request, book, route, body)
        if faulty is not None:
            return faulty
    return Response(body, media_type="application/json")


def _add_chat_routes(
    app: FastAPI, book: FaultBook, model: ChatModel, prefix: str, route: str, delay: float
) -> None:
    @app.get(f"{prefix}/v1/models", name=f"{route}_models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "standin", "object": "model"}]}

    @app.post(f"{prefix}/v1/chat/completions", name=f"{route}_completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        fault = book.take(route)
        await asyncio.sleep(delay)
        if not body.get("stream"):
            return await _answer(request, book, route, fault, json.loads(model.completion(body)))
        if fault is not None and fault.kind in ("slow", "http_error"):
            faulty = await body_fault(fault, request, book, route, b"")
            if faulty is not None:
                return faulty
            fault = None  # slow: stalled, now answers normally
        stream = model.stream() if fault is None else model.faulty_stream(fault, request)
        return ClosingStreamingResponse(
            tracked(book, route, stream), media_type="text/event-stream"
        )


# --------------------------------------------------------------------------- serving


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Run `app` with uvicorn on a free loopback port in a daemon thread; yields its URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="error",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    app.state.uvicorn_server = server  # how the `reset` fault finds a connection's socket
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _fault_arg(text: str) -> tuple[str, str]:
    route, _, kind = text.partition(":")
    if route not in ROUTES or kind not in APPLICABLE.get(route, ()):
        raise argparse.ArgumentTypeError(f"expected route:fault, got {text!r}")
    return route, kind


def main() -> None:
    parser = argparse.ArgumentParser(description="TEI + OpenAI + retriever stand-in on loopback")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--tokens", type=int, default=20, help="pieces in a chat reply")
    parser.add_argument(
        "--token-interval", type=float, default=0.0, help="seconds between streamed pieces"
    )
    parser.add_argument("--dimension", type=int, default=DIMENSION, help="embedding width")
    parser.add_argument(
        "--fault",
        type=_fault_arg,
        action="append",
        default=[],
        metavar="ROUTE:FAULT",
        help=f"a fault in force from the start; routes {ROUTES}, faults {FAULTS}",
    )
    args = parser.parse_args()
    app = create_standin_app(
        delay=args.delay,
        tokens=args.tokens,
        token_interval=args.token_interval,
        dimension=args.dimension,
    )
    for route, kind in args.fault:
        app.state.faults.set(route, Fault(kind))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    )
    app.state.uvicorn_server = server
    server.run()


if __name__ == "__main__":
    main()
