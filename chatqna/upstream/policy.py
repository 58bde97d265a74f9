"""Shared HTTP plumbing for remote backends: one client per upstream, bounded calls, retries.

Every remote backend owns one `UpstreamClient` (`chatqna.upstream.client`), whose
timeouts bound connecting and each read. `post_json`
also bounds a whole call, so an upstream that trickles bytes forever still ends, and
retries idempotent calls (embeddings, rerank, retrieval) by a `RetryPolicy`. Every failure
is translated here into the typed errors of `chatqna.errors`, so callers never see an
httpx exception.

Retried: connection failures and resets, protocol errors (a body cut short), timeouts, and
HTTP 5xx and 429. Not retried: other 4xx (the request itself is wrong), a body that is
not the documented shape or is larger than the client reads (`ResponseTooLarge`): the
upstream would answer the same again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from chatqna.errors import BadUpstreamResponse, UpstreamError, UpstreamFailure, UpstreamTimeout
from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.types import Reply, ResponseTooLarge

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How many times an idempotent upstream call is tried, and how long to wait in between.

    `attempts` counts the first try. The wait before retry n (from 1) is drawn uniformly
    from [c/2, c] with c = min(backoff_seconds * 2**(n-1), max_backoff_seconds): exponential
    backoff with "equal jitter" (AWS Architecture Blog, "Exponential Backoff And Jitter",
    2015), so calls that failed together spread out, yet none retries at once. `sleep` and
    `jitter` are injectable so tests can record the waits instead of taking them.
    """

    attempts: int = 1
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 5.0
    sleep: Callable[[float], Awaitable[None]] = field(
        default=asyncio.sleep, compare=False, repr=False
    )
    jitter: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff_seconds < 0 or self.max_backoff_seconds < 0:
            raise ValueError("backoff times cannot be negative")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 for the second attempt)."""
        ceiling = min(self.backoff_seconds * 2.0 ** (retry - 1), self.max_backoff_seconds)
        return ceiling * (0.5 + 0.5 * self.jitter())


NO_RETRY = RetryPolicy(attempts=1)


class HTTPStatusFailure(Exception):
    """An upstream answered with an error status (4xx, 5xx); `body` is the start of what
    it said (for a client that reads a known error out of it)."""

    def __init__(self, status: int, body: bytes = b"") -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body[:ERROR_BODY_BYTES]


# How much of an error answer is kept: error objects are small.
ERROR_BODY_BYTES = 4096


def raise_for_status(reply: Reply) -> Reply:
    """`reply` itself, unless its status is an error."""
    if reply.status >= 400:
        raise HTTPStatusFailure(reply.status, reply.body)
    return reply


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, HTTPStatusFailure):
        return exc.status
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code
    return None


# What the client raises on a transport failure: httpx's exceptions.
TRANSPORT_FAILURES = (httpx.HTTPError,)


RETRYABLE_FAILURES = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    TimeoutError,
)


def timed_out(exc: BaseException) -> bool:
    """Whether time ran out: a whole-call bound (`asyncio.timeout`) or a transport timeout
    (httpx's `ConnectTimeout`, `ReadTimeout`, `WriteTimeout`, `PoolTimeout`)."""
    return isinstance(exc, (TimeoutError, httpx.TimeoutException))


def is_retryable(exc: BaseException) -> bool:
    """A failure that another attempt of the same idempotent call may not meet again."""
    status = _status(exc)
    if status is not None:
        return status == 429 or status >= 500
    return isinstance(exc, RETRYABLE_FAILURES)


def _failure(exc: BaseException) -> str:
    """The failure's name: an HTTP status, or the exception's class."""
    status = _status(exc)
    return f"HTTP {status}" if status is not None else type(exc).__name__


def translate_http_error(
    exc: Exception, *, backend: str, what: str, attempts: int = 1
) -> UpstreamFailure:
    """Map an exception raised while calling `what` on `backend` to our error tree.

    A `TimeoutError` is a whole-call bound (`asyncio.timeout`) that ran out. A body too
    large to read (`ResponseTooLarge`), like any failure that is not the transport's, is a
    bad response.
    """
    tried = f" (after {attempts} attempts)" if attempts > 1 else ""
    if timed_out(exc):
        return UpstreamTimeout(f"{backend}: {what} timed out{tried}", backend=backend)
    status = _status(exc)
    if status is not None:
        return UpstreamError(f"{backend}: {what} returned HTTP {status}{tried}", backend=backend)
    if isinstance(exc, TRANSPORT_FAILURES):
        return UpstreamError(f"{backend}: {what} failed ({_failure(exc)}){tried}", backend=backend)
    return BadUpstreamResponse(f"{backend}: {what} failed: {exc}", backend=backend)


UPSTREAM_FAILURES = (*TRANSPORT_FAILURES, HTTPStatusFailure, ResponseTooLarge, TimeoutError)


async def with_retries(
    attempt: Callable[[], Awaitable[Reply]],
    *,
    retry: RetryPolicy,
    backend: str,
    what: str,
) -> Reply:
    """Run `attempt` until it succeeds, fails for good, or `retry.attempts` are spent."""
    for number in range(1, retry.attempts + 1):
        try:
            return await attempt()
        except UPSTREAM_FAILURES as exc:
            if number == retry.attempts or not is_retryable(exc):
                raise translate_http_error(
                    exc, backend=backend, what=what, attempts=number
                ) from exc
            wait = retry.delay(number)
            logger.warning(
                "%s: %s failed (%s), attempt %d of %d; retrying in %.2fs",
                backend,
                what,
                _failure(exc),
                number,
                retry.attempts,
                wait,
            )
            await retry.sleep(wait)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def post_json(
    client: UpstreamClient,
    path: str,
    payload: dict[str, Any],
    *,
    backend: str,
    retry: RetryPolicy = NO_RETRY,
    timeout_seconds: float | None = None,
) -> Any:
    """POST `payload` and return the decoded JSON body, or raise a typed upstream error.

    `timeout_seconds` bounds each attempt as a whole (the client's own timeouts bound each
    read); `retry` says how often a retryable failure is tried again.
    """

    async def attempt() -> Reply:
        async with asyncio.timeout(timeout_seconds):
            reply = await client.post(path, payload)
        return raise_for_status(reply)

    reply = await with_retries(attempt, retry=retry, backend=backend, what=f"POST {path}")
    try:
        return reply.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(
            f"{backend}: POST {path} returned a body that is not JSON", backend=backend
        ) from exc


def require(condition: bool, *, backend: str, what: str) -> None:
    """Raise `BadUpstreamResponse` unless the upstream body has the documented shape."""
    if not condition:
        raise BadUpstreamResponse(f"{backend}: unexpected response shape: {what}", backend=backend)
