"""aiohttp's failures become the httpx exceptions that `chatqna.backends.http` retries and
translates (the fault tests in tests/integration run the engine against real servers)."""

from __future__ import annotations

import aiohttp
import httpx
import pytest

from chatqna.backends.aiohttp_engine import httpx_errors
from chatqna.backends.http import is_retryable, translate_http_error


def reset_under_the_body() -> aiohttp.ClientPayloadError:
    error = aiohttp.ClientPayloadError("Response payload is not completed")
    error.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    return error


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (aiohttp.ConnectionTimeoutError("connect"), httpx.ConnectTimeout),
        (aiohttp.SocketTimeoutError("read"), httpx.ReadTimeout),
        (aiohttp.ServerDisconnectedError(), httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError("cut short"), httpx.RemoteProtocolError),
        (reset_under_the_body(), httpx.ReadError),
        (aiohttp.ClientOSError(104, "reset"), httpx.ReadError),
        (aiohttp.ClientError("other"), httpx.NetworkError),
    ],
)
def test_aiohttp_failures_are_the_matching_httpx_ones(
    raised: Exception, expected: type[httpx.HTTPError]
) -> None:
    with pytest.raises(expected) as caught, httpx_errors():
        raise raised
    assert caught.value.__cause__ is raised
    assert is_retryable(caught.value)  # every one of these may pass on another attempt


def test_a_connect_timeout_is_reported_as_a_timeout() -> None:
    with pytest.raises(httpx.ConnectTimeout) as caught, httpx_errors():
        raise aiohttp.ConnectionTimeoutError("connect")
    failure = translate_http_error(caught.value, backend="embedder", what="POST /v1/embeddings")
    assert failure.code == "upstream_timeout"


def test_other_errors_pass_through_unchanged() -> None:
    with pytest.raises(ValueError, match="not an HTTP failure"), httpx_errors():
        raise ValueError("not an HTTP failure")
