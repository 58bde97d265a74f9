"""Error rendering: each error's envelope, status and headers, byte for byte."""

from __future__ import annotations

import logging

import httpx2
import orjson
import pytest
from fastapi import FastAPI

from chatqna.api.errors import error_headers, error_response, install_error_handlers
from chatqna.backends.fakes import ScriptedLLM
from chatqna.errors import (
    InternalError,
    InvalidJson,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
    UpstreamError,
)
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse

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


@pytest.mark.parametrize(
    ("body", "details"),
    [
        # Each union member refused the number: one entry, no pydantic union tags.
        (
            {"messages": 123},
            [{"field": "messages", "message": "Input should be a valid string or a valid list"}],
        ),
        # A list was meant: only the list member's error, at its path.
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            [{"field": "messages.0.content.0.text", "message": "Input should be a valid string"}],
        ),
        ({"k": 2}, [{"field": "messages", "message": "Field required"}]),
        (
            {"messages": "hi", "k": "a", "top_n": 0},
            [
                {"field": "k", "message": "Input should be a valid integer"},
                {"field": "top_n", "message": "Input should be greater than or equal to 1"},
            ],
        ),
    ],
)
async def test_validation_details_name_fields_without_union_tags(
    client_for: ClientFactory, body: dict[str, object], details: list[dict[str, str]]
) -> None:
    client = await client_for()
    response = await client.post("/v1/chatqna", json=body)
    assert response.status_code == 422
    assert response.json()["details"] == details


async def test_a_form_fields_validation_detail_keeps_its_name(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.post(
        "/v1/dataprep/ingest",
        files=[("files", ("a.md", b"# A\n\ntext", "text/markdown"))],
        data={"chunk_size": "many"},
    )
    assert response.status_code == 422
    assert [d["field"] for d in response.json()["details"]] == ["chunk_size"]


def _upstream_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "chatqna.api.errors" and r.levelno == logging.WARNING
    ]


async def test_a_streamed_upstream_failure_is_logged_as_a_non_streamed_one(
    client_for: ClientFactory, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The status of a stream went out before its LLM failed; the operator still reads the
    same warning, naming the route and the failure, as for an answer that was not streamed."""
    caplog.set_level(logging.WARNING)
    cut = UpstreamError("llm: the stream was cut", backend="llm")
    logged = []
    for stream, fail_after in ((False, None), (True, 2)):
        llm = ScriptedLLM("one two three", fail_after=fail_after, error=cut)
        client = await client_for(await make_backends(settings, llm=llm))
        caplog.clear()
        response = await client.post("/v1/chatqna", json={"messages": "hi", "stream": stream})
        if stream:
            name, data = parse_sse(response.text)[-2]
            assert (response.status_code, name) == (200, "error")
            envelope = orjson.loads(data)
        else:
            assert response.status_code == 502
            envelope = response.json()
        assert envelope == cut.envelope()
        logged.append(_upstream_warnings(caplog))
    assert logged[0] == ["upstream failure on /v1/chatqna: llm: the stream was cut"]
    assert logged[1] == logged[0]


async def test_a_routing_error_keeps_its_status_and_headers_under_its_own_code(
    client_for: ClientFactory,
) -> None:
    client = await client_for()
    wrong_method = await client.get("/v1/chatqna")
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"
    assert wrong_method.content == b'{"error":"method_not_allowed","message":"Method Not Allowed"}'
    missing = await client.get("/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.content == b'{"error":"not_found","message":"Not Found"}'


async def test_a_stream_cut_by_another_failure_is_logged_once_as_cut(
    client_for: ClientFactory, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused request is the client's to read, but an answer cut after its status went
    out is worth the operator's line, whatever failed."""
    caplog.set_level(logging.WARNING)
    failure = ServiceUnavailable("the index is shutting down")
    llm = ScriptedLLM("one two three", fail_after=2, error=failure)
    client = await client_for(await make_backends(settings, llm=llm))
    response = await client.post("/v1/chatqna", json={"messages": "hi", "stream": True})
    name, data = parse_sse(response.text)[-2]
    assert (response.status_code, name, orjson.loads(data)) == (200, "error", failure.envelope())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["stream failed after it started: the index is shutting down"]
