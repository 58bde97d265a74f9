"""A reverse proxy that serves an upstream under a path prefix and strips it on the way in.

It behaves like Traefik's `StripPrefix` or Caddy's `handle_path`, not like nginx's
`location /chat/`: `/chat` and `/chat/` both reach the upstream as `/`, with no redirect to
add the trailing slash, so a page at `/chat` must not rely on relative URLs. Paths outside
the prefix get 404. The `Host` header goes on as it came, as the deployment guide asks of a
proxy; responses stream back unbuffered (the chat's Server-Sent Events included).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

# Per connection, not end to end (RFC 9110, section 7.6.1); each side sets its own.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


def stripping_proxy(upstream: str, prefix: str) -> FastAPI:
    """An app that passes `{prefix}{rest}` on to `{upstream}{rest or "/"}`."""
    client = httpx2.AsyncClient(base_url=upstream, timeout=60)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with client:
            yield

    app = FastAPI(lifespan=lifespan)

    @app.api_route(prefix + "{rest:path}", methods=["GET", "HEAD", "POST", "DELETE"])
    async def forward(request: Request, rest: str) -> Response:
        if rest and not rest.startswith("/"):  # `/chatter` is not under `/chat`
            return Response(status_code=404)
        headers = [(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP]
        outbound = client.build_request(
            request.method,
            rest or "/",
            params=request.query_params,
            headers=headers,
            content=await request.body(),
        )
        answer = await client.send(outbound, stream=True)
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            headers={k: v for k, v in answer.headers.items() if k not in HOP_BY_HOP},
            background=BackgroundTask(answer.aclose),
        )

    return app
