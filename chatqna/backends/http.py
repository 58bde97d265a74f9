"""Shared HTTP plumbing for remote backends: one client per upstream, one error translation.

Every remote backend owns one `httpx.AsyncClient` built by `upstream_client`, with explicit
timeouts; every failure of a call is translated here into the typed errors of
`chatqna.errors`, so callers never see an httpx exception.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from chatqna.errors import BadUpstreamResponse, UpstreamError, UpstreamFailure, UpstreamTimeout
from chatqna.telemetry.tracing import instrument_http_client


def upstream_client(
    base_url: str,
    *,
    timeout_seconds: float,
    connect_timeout_seconds: float,
    headers: dict[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """The one client a remote backend keeps for its whole life."""
    client = httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(timeout_seconds, connect=connect_timeout_seconds),
        headers=headers,
        transport=transport,
        limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
    )
    instrument_http_client(client)
    return client


def translate_http_error(exc: Exception, *, backend: str, what: str) -> UpstreamFailure:
    """Map an httpx exception raised while calling `what` on `backend` to our error tree."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"{backend}: {what} timed out", backend=backend)
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return UpstreamError(f"{backend}: {what} returned HTTP {status}", backend=backend)
    if isinstance(exc, httpx.HTTPError):
        return UpstreamError(f"{backend}: {what} failed ({type(exc).__name__})", backend=backend)
    return BadUpstreamResponse(f"{backend}: {what} failed: {exc}", backend=backend)


async def post_json(
    client: httpx.AsyncClient, path: str, payload: dict[str, Any], *, backend: str
) -> Any:
    """POST `payload` and return the decoded JSON body, or raise a typed upstream error."""
    try:
        response = await client.post(path, json=payload)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise translate_http_error(exc, backend=backend, what=f"POST {path}") from exc
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(
            f"{backend}: POST {path} returned a body that is not JSON", backend=backend
        ) from exc


def require(condition: bool, *, backend: str, what: str) -> None:
    """Raise `BadUpstreamResponse` unless the upstream body has the documented shape."""
    if not condition:
        raise BadUpstreamResponse(f"{backend}: unexpected response shape: {what}", backend=backend)
