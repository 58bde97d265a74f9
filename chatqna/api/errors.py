"""Rendering errors: every exception that reaches a client becomes the one envelope.

`error_reply` is the one mapping from an exception to what its client is told: a
`ChatQnAError` carries its own status, code and envelope; anything unexpected is a 500
`internal_error` whose details stay in the log. The exception handlers send its reply as a
response, a chat stream that already started as its `event: error` (`chatqna.api.chat`).
FastAPI's and Starlette's own exceptions are typed first: validation errors become
`invalid_request` (422; malformed JSON is 400 `invalid_json`), routing errors keep their
status and headers with a `not_found` / `method_not_allowed` code. What each route can
answer is declared in `chatqna.api.error_schemas`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from chatqna.errors import (
    ChatQnAError,
    InternalError,
    InvalidJson,
    InvalidRequest,
    TooManyRequests,
    UpstreamFailure,
)

logger = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class FrameworkHttpError(ChatQnAError):
    """An HTTP error Starlette or FastAPI raised (no such route, a method the route does not
    take...): its status, a code named after it, and its own headers (`Allow` on a 405)."""

    def __init__(self, exc: StarletteHTTPException) -> None:
        super().__init__(str(exc.detail), status_code=exc.status_code)
        self.code = _HTTP_CODES.get(exc.status_code, "http_error")
        self.headers = dict(exc.headers or {})


class ErrorReply(NamedTuple):
    """What a client is told of an error: the status, the envelope and the headers besides
    it (a streamed answer, whose status went out already, sends the envelope alone)."""

    status: int
    envelope: dict[str, Any]
    headers: dict[str, str]


def error_headers(exc: ChatQnAError) -> dict[str, str]:
    """The headers an error's response carries besides its envelope: the scheme a 401 asks
    for (a guard that challenges Basic sets its own), when to retry a 429, and those a
    framework error came with."""
    if isinstance(exc, FrameworkHttpError):
        return exc.headers
    if isinstance(exc, TooManyRequests):
        return {"Retry-After": str(exc.retry_after_seconds)}
    if exc.status_code == 401:
        return {"WWW-Authenticate": "Bearer"}
    return {}


def error_reply(exc: BaseException, path: str) -> ErrorReply:
    """`exc`, raised while answering `path`, as what its client is told: a `ChatQnAError`
    as its own envelope, anything else as a bare `internal_error` (the exception goes to the
    log). A failed backend is logged as a warning whether the answer was streamed or not."""
    if isinstance(exc, ChatQnAError):
        error = exc
    else:
        logger.exception("unexpected error on %s", path, exc_info=exc)
        error = InternalError()
    if isinstance(error, UpstreamFailure):
        logger.warning("upstream failure on %s: %s", path, error.message)
    return ErrorReply(error.status_code, error.envelope(), error_headers(error))


def reply_response(reply: ErrorReply) -> JSONResponse:
    return JSONResponse(status_code=reply.status, content=reply.envelope, headers=reply.headers)


def error_response(exc: ChatQnAError) -> JSONResponse:
    """`exc` as the error envelope, with its status and headers (for a refusal raised
    outside the routes, in a middleware, which no exception handler sees)."""
    return reply_response(ErrorReply(exc.status_code, exc.envelope(), error_headers(exc)))


@dataclass(frozen=True)
class _Located:
    """One validation error, at its field path (names and indices only)."""

    path: tuple[str | int, ...]
    message: str
    # The path length at each union tag pydantic put in the error's location, and whether
    # the location ended at one (that union member refused the value's type outright).
    tags: tuple[int, ...]
    ends_at_tag: bool


def _locate(error: Mapping[str, Any], body: Any) -> _Located:
    """The error's field path, walked through the request body: a location entry that names
    no key or index of the value there is a union tag (`list[ChatMessage]`,
    `function-after[...]`), pydantic's name for a union member, not a field, unless it
    names the field an error of type `missing` says is absent."""
    loc = list(error.get("loc", ()))
    if loc[:1] == ["body"] and isinstance(body, (Mapping, list)):  # a form's too
        loc = loc[1:]
    else:
        loc, body = [p for p in loc if p != "body"], None  # nothing to walk: names as given
    path: list[str | int] = []
    tags: list[int] = []
    node, ends_at_tag = body, False
    for at, part in enumerate(loc):
        last = at == len(loc) - 1
        if isinstance(part, int) or body is None:
            path.append(part)
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
        elif isinstance(node, Mapping) and part in node:
            path.append(part)
            node = node[part]
        elif last and error.get("type") == "missing":
            path.append(part)
        else:
            tags.append(len(path))
            ends_at_tag = last
    return _Located(tuple(path), str(error.get("msg", "")), tuple(tags), ends_at_tag)


def _went_deeper(error: _Located, others: Sequence[_Located]) -> bool:
    """Whether another member of the union `error` stopped at took the value's type and
    failed further in: that member is the one the client meant, so `error` is noise."""
    at = len(error.path)
    return any(
        at in other.tags and other.path[:at] == error.path and len(other.path) > at
        for other in others
    )


def _joined(messages: list[str]) -> str:
    """One message for a field: "Input should be a valid string or a valid list"."""
    prefix = "Input should be "
    if len(messages) > 1 and all(m.startswith(prefix) for m in messages):
        return prefix + " or ".join(m.removeprefix(prefix) for m in messages)
    return "; ".join(messages)


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    """One entry per field, named by its path (`messages.0.content`) without pydantic's
    union tags; the errors of the union members a value did not try to be are dropped, and
    the rest for one field joined into one message."""
    located = [_locate(error, exc.body) for error in exc.errors()]
    kept = [e for e in located if not (e.ends_at_tag and _went_deeper(e, located))]
    by_field: dict[str, list[str]] = {}
    for error in kept:
        messages = by_field.setdefault(".".join(str(part) for part in error.path), [])
        if error.message not in messages:
            messages.append(error.message)
    return [{"field": field, "message": _joined(messages)} for field, messages in by_field.items()]


# FastAPI's words for a body it could not parse beyond a JSON syntax error (bytes that are
# not UTF-8, a number too long to convert, nesting too deep to decode).
_BODY_NOT_PARSED = "There was an error parsing the body"


def _typed(request: Request, exc: Exception) -> Exception:
    """FastAPI's and Starlette's exceptions as the typed exceptions they stand for; any
    other exception as it is."""
    if isinstance(exc, RequestValidationError):
        if any(error.get("type") == "json_invalid" for error in exc.errors()):
            return InvalidJson()
        return InvalidRequest(
            "The request does not match the expected schema.",
            details=_validation_details(exc),
            status_code=422,
        )
    if isinstance(exc, StarletteHTTPException):
        content_type = request.headers.get("content-type", "")
        if exc.status_code == 400 and exc.detail == _BODY_NOT_PARSED and "json" in content_type:
            return InvalidJson()
        return FrameworkHttpError(exc)
    return exc


async def on_error(request: Request, exc: Exception) -> JSONResponse:
    return reply_response(error_reply(_typed(request, exc), request.url.path))


def install_error_handlers(app: FastAPI) -> None:
    for caught in (ChatQnAError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(caught, on_error)
