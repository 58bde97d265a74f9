"""Error rendering: each error's envelope, status and headers, byte for byte."""

from __future__ import annotations

import httpx2
import pytest
from fastapi import FastAPI

from chatqna.api.errors import error_headers, error_response, install_error_handlers
from chatqna.errors import (
    InternalError,
    InvalidJson,
    InvalidRequest,
    NotFound,
    TooManyRequests,
    Unauthorized,
)

pytestmark = pytest.mark.anyio


def test_the_fixed_envelopes_keep_their_bytes() -> None:
    internal = error_response(InternalError())
    assert internal.status_code == 500
    assert internal.body == b'{"error":"internal_error","message":"An unexpected error occurred."}'
    invalid = error_response(InvalidJson())
    assert invalid.status_code == 400
    assert (
        invalid.body == b'{"error":"invalid_json","message":"The request body is not valid JSON."}'
    )
    assert isinstance(InvalidJson(), InvalidRequest)


def test_a_refusal_carries_its_own_headers() -> None:
    assert error_headers(TooManyRequests("busy")) == {"Retry-After": "1"}
    assert error_headers(Unauthorized("no key")) == {"WWW-Authenticate": "Bearer"}
    assert error_headers(NotFound("gone")) == {}
    assert error_response(TooManyRequests("busy")).headers["retry-after"] == "1"


async def test_an_unexpected_exception_is_a_500_that_says_nothing_more() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a secret detail")

    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://localhost:8888") as client:
        response = await client.get("/boom")
    assert response.status_code == 500
    assert response.content == (
        b'{"error":"internal_error","message":"An unexpected error occurred."}'
    )
