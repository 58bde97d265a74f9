"""Shared HTTP plumbing for remote backends: one client per upstream, bounded calls, retries.

Every remote backend owns one `UpstreamClient` (`chatqna.upstream.client`), whose
timeouts bound connecting and each read. `post_json`
also bounds a whole call, so an upstream that trickles bytes forever still ends, and
retries idempotent calls (embeddings, rerank, retrieval) by a `RetryPolicy`. Every failure
is translated here into the typed errors of `chatqna.errors`, so callers never see an
httpx2 exception.

Retried: connection failures and resets, protocol errors (a body cut short), timeouts, and
HTTP 5xx and 429. Not retried: other 4xx (the request itself is wrong), a body that is
not the documented shape or is larger than the client reads (`ResponseTooLarge`): the
upstream would answer the same again. A 429 or 5xx that carries `Retry-After` is retried
no sooner than it asks, or, when it asks for more than the call can wait, not at all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx2
from opentelemetry.util.types import AttributeValue

from chatqna.errors import BadUpstreamResponse, UpstreamError, UpstreamFailure, UpstreamTimeout
from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.types import Reply, ResponseTooLarge

logger = logging.getLogger(__name__)


def utc_now() -> datetime:
    """The wall-clock time, aware (in UTC)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class RetryPolicy:
    """How many times an idempotent upstream call is tried, and how long to wait in between.

    `attempts` counts the first try. The wait before retry n (from 1) is drawn uniformly
    from [c/2, c] with c = min(backoff_seconds * 2**(n-1), max_backoff_seconds): exponential
    backoff with "equal jitter" (AWS Architecture Blog, "Exponential Backoff And Jitter",
    2015), so calls that failed together spread out, yet none retries at once.

    An upstream's `Retry-After` lengthens the wait to what it asks for, up to
    `max_retry_after_seconds`: asked for more, or for a pause past the call's deadline,
    the call fails at once rather than retry sooner than asked. `sleep`, `jitter`, `clock`
    (the monotonic time deadlines are read on) and `now` (the wall-clock time, an aware
    one, that a `Retry-After` HTTP-date is counted from) are injectable so tests can
    record the waits instead of taking them.
    """

    attempts: int = 1
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 5.0
    max_retry_after_seconds: float = 60.0
    sleep: Callable[[float], Awaitable[None]] = field(
        default=asyncio.sleep, compare=False, repr=False
    )
    jitter: Callable[[], float] = field(default=random.random, compare=False, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)
    now: Callable[[], datetime] = field(default=utc_now, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if min(self.backoff_seconds, self.max_backoff_seconds, self.max_retry_after_seconds) < 0:
            raise ValueError("backoff times cannot be negative")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 for the second attempt)."""
        ceiling = min(self.backoff_seconds * 2.0 ** (retry - 1), self.max_backoff_seconds)
        return ceiling * (0.5 + 0.5 * self.jitter())

    def refusal(self, asked: float, deadline: float | None) -> str | None:
        """Why a pause of `asked` seconds, which an upstream's `Retry-After` asked for, is
        not waited out (None when it is): longer than this policy waits, or ending past
        `deadline` (a `clock` time)."""
        shown = f"{round(asked, 1):g} s"
        if asked > self.max_retry_after_seconds:
            limit = f"{self.max_retry_after_seconds:g} s"
            return f"Retry-After asks for {shown}, more than the {limit} waited at most"
        if deadline is not None and self.clock() + asked > deadline:
            return f"Retry-After asks for {shown}, past the call's deadline"
        return None


NO_RETRY = RetryPolicy(attempts=1)


class HTTPStatusFailure(Exception):
    """An upstream answered with an error status (4xx, 5xx); `body` is the start of what
    it said (for a client that reads a known error out of it), `retry_after` its
    `Retry-After` header as sent."""

    def __init__(self, status: int, body: bytes = b"", retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body[:ERROR_BODY_BYTES]
        self.retry_after = retry_after


# How much of an error answer is kept: error objects are small.
ERROR_BODY_BYTES = 4096


def raise_for_status(reply: Reply) -> Reply:
    """`reply` itself, unless its status is an error."""
    if reply.status >= 400:
        raise HTTPStatusFailure(reply.status, reply.body, reply.retry_after)
    return reply


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """The pause a `Retry-After` header asks for (RFC 9110 §10.2.3), in seconds from `now`
    (an aware time): delay-seconds (`30`), or an HTTP-date (`Fri, 31 Dec 1999 23:59:59
    GMT`; one already past asks for none). None without a header or for one that is
    neither: such a header is ignored."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when.tzinfo is None:  # a `-0000` zone: UTC, by RFC 5322
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, HTTPStatusFailure):
        return exc.status
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code
    return None


def _retry_after(exc: BaseException) -> str | None:
    if isinstance(exc, HTTPStatusFailure):
        return exc.retry_after
    if isinstance(exc, httpx2.HTTPStatusError):
        value: str | None = exc.response.headers.get("retry-after")
        return value
    return None


# What the client raises on a transport failure: httpx2's exceptions.
TRANSPORT_FAILURES = (httpx2.HTTPError,)


RETRYABLE_FAILURES = (
    httpx2.TimeoutException,
    httpx2.NetworkError,
    httpx2.RemoteProtocolError,
    TimeoutError,
)


def timed_out(exc: BaseException) -> bool:
    """Whether time ran out: a whole-call bound (`asyncio.timeout`) or a transport timeout
    (httpx2's `ConnectTimeout`, `ReadTimeout`, `WriteTimeout`, `PoolTimeout`)."""
    return isinstance(exc, (TimeoutError, httpx2.TimeoutException))


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
    exc: Exception, *, backend: str, what: str, attempts: int = 1, reason: str | None = None
) -> UpstreamFailure:
    """Map an exception raised while calling `what` on `backend` to our error tree.

    A `TimeoutError` is a whole-call bound (`asyncio.timeout`) that ran out. A body too
    large to read (`ResponseTooLarge`), like any failure that is not the transport's, is a
    bad response. `reason` says why the call stopped before its attempts were spent.
    """
    notes = [f"after {attempts} attempts"] if attempts > 1 else []
    notes += [reason] if reason is not None else []
    tried = f" ({'; '.join(notes)})" if notes else ""
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
    deadline: float | None = None,
) -> Reply:
    """Run `attempt` until it succeeds, fails for good, or `retry.attempts` are spent.

    A failure whose `Retry-After` asks for longer than the backoff is waited out as asked,
    if the pause ends by `deadline` (a `retry.clock()` time; None: no deadline) and within
    the policy's most; otherwise the call fails now, without another attempt.
    """
    for number in range(1, retry.attempts + 1):
        try:
            return await attempt()
        except UPSTREAM_FAILURES as exc:
            if number == retry.attempts or not is_retryable(exc):
                raise translate_http_error(
                    exc, backend=backend, what=what, attempts=number
                ) from exc
            wait = retry.delay(number)
            asked = retry_after_seconds(_retry_after(exc), retry.now())
            if asked is not None and asked > wait:
                refusal = retry.refusal(asked, deadline)
                if refusal is not None:
                    raise translate_http_error(
                        exc, backend=backend, what=what, attempts=number, reason=refusal
                    ) from exc
                wait = asked
            logger.warning(
                "%s: %s failed (%s), attempt %d of %d; retrying in %.2fs%s",
                backend,
                what,
                _failure(exc),
                number,
                retry.attempts,
                wait,
                " (as its Retry-After asks)" if wait == asked else "",
            )
            await retry.sleep(wait)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _retry_deadline(retry: RetryPolicy, timeout_seconds: float | None) -> float | None:
    """The latest `retry.clock()` time a retry may start at, in a call of `retry.attempts`
    attempts of up to `timeout_seconds` each (None: no bound)."""
    if timeout_seconds is None:
        return None
    return retry.clock() + (retry.attempts - 1) * timeout_seconds


async def get_reply(
    client: UpstreamClient,
    path: str,
    *,
    backend: str,
    retry: RetryPolicy = NO_RETRY,
    timeout_seconds: float | None = None,
) -> Reply:
    """GET `path` under `post_json`'s bounds and retries, for a caller to whom an error
    status may be an answer (`404`: the route is not there). A retryable status (429,
    5xx) is retried and, once the attempts are spent, raised as a typed error like a
    transport failure; any other reply is returned whatever its status."""

    async def attempt() -> Reply:
        async with asyncio.timeout(timeout_seconds):
            reply = await client.get(path)
        return raise_for_status(reply) if reply.status == 429 or reply.status >= 500 else reply

    what = f"GET {path}"
    deadline = _retry_deadline(retry, timeout_seconds)
    return await with_retries(attempt, retry=retry, backend=backend, what=what, deadline=deadline)


async def post_json(
    client: UpstreamClient,
    path: str,
    payload: dict[str, Any],
    *,
    backend: str,
    retry: RetryPolicy = NO_RETRY,
    timeout_seconds: float | None = None,
    max_body_bytes: int | None = None,
    span_attributes: Mapping[str, AttributeValue] | None = None,
) -> Any:
    """POST `payload` and return the decoded JSON body, or raise a typed upstream error.

    `timeout_seconds` bounds each attempt as a whole (the client's own timeouts bound each
    read); `retry` says how often a retryable failure is tried again. The call as a whole
    may take `retry.attempts × timeout_seconds` (and the backoff): a `Retry-After` pause is
    waited out only if the attempt after it, given its whole `timeout_seconds`, still ends
    within that. `max_body_bytes` is the most the answer may hold, sized by the caller to
    what it asked for (the client's limit stays the outer bound): a larger body fails as a
    bad response while it is read, never parsed, since parsing holds the event loop.
    `span_attributes` go on each attempt's client span.
    """

    async def attempt() -> Reply:
        async with asyncio.timeout(timeout_seconds):
            reply = await client.post(path, payload, span_attributes, max_body_bytes=max_body_bytes)
        return raise_for_status(reply)

    what = f"POST {path}"
    deadline = _retry_deadline(retry, timeout_seconds)
    reply = await with_retries(attempt, retry=retry, backend=backend, what=what, deadline=deadline)
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
