"""Stand-in upstream servers speaking TEI's and OpenAI's wire formats, on loopback.

For benchmarks and end-to-end tests that need an upstream whose speed is known: vectors are
feature-hashed (texts sharing words get similar vectors), and the chat server streams a
fixed reply `tokens` pieces long after `delay` seconds. They run in a thread of the calling
process (`serve_in_thread`) or as their own process (`python -m tests.standins.servers`).
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
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

DIMENSION = 64


def hashed_vector(text: str, dimension: int = DIMENSION) -> list[float]:
    row = np.zeros(dimension, dtype=np.float32)
    for token in text.lower().split() or ["<empty>"]:
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        row[int.from_bytes(digest, "little") % dimension] += 1.0
    row /= np.linalg.norm(row)
    return [float(x) for x in row]


def create_standin_app(*, delay: float = 0.0, tokens: int = 20) -> FastAPI:
    """One app serving TEI `/v1/embeddings`, `/rerank` and OpenAI `/v1/chat/completions`."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        sent = (await request.json())["input"]
        texts = [sent] if isinstance(sent, str) else sent
        await asyncio.sleep(delay)
        return {
            "object": "list",
            "model": "standin",
            "data": [
                {"object": "embedding", "index": i, "embedding": hashed_vector(t)}
                for i, t in enumerate(texts)
            ],
        }

    @app.post("/rerank")
    async def rerank(request: Request) -> list[dict[str, Any]]:
        body = await request.json()
        query = set(body["query"].lower().split())
        scores = [len(query & set(t.lower().split())) / (1 + len(query)) for t in body["texts"]]
        await asyncio.sleep(delay)
        return sorted(
            ({"index": i, "score": s} for i, s in enumerate(scores)),
            key=lambda item: -item["score"],
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "standin", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        await asyncio.sleep(delay)
        pieces = [f"word{i} " for i in range(tokens)]
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": "standin",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "".join(pieces)},
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": tokens},
                }
            )

        async def stream() -> AsyncIterator[str]:
            for piece in pieces:
                chunk = {
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
            final = {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
            yield f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Run `app` with uvicorn on a free loopback port in a daemon thread; yields its URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False)
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description="TEI + OpenAI stand-in server on loopback")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--tokens", type=int, default=20)
    args = parser.parse_args()
    uvicorn.run(
        create_standin_app(delay=args.delay, tokens=args.tokens),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
