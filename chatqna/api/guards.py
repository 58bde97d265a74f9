"""Request guards in front of every route: the API key, the body size (and an upload's
end), chat concurrency; the admission of uploads is `chatqna.api.ingest_admission`, the
`Host` check `chatqna.api.hosts`. The JSON endpoints also depend on `require_json_body` (a
body sent as JSON, else 415).

They are plain ASGI middleware rather than route dependencies, for three reasons: a route
added later is guarded without having to remember it (the API key also covers `/docs` and
`/openapi.json`); a body is refused before anything parses it, and an upload before its
body is read; and a chat slot (or an upload's place in the parse pool) is held for the
whole life of the request, which for a streamed answer outlives the route handler.

`create_app` installs them inside the request-metrics middleware (so refusals are counted)
and inside CORS (so a browser can read a refusal): API key, then body size, then an
upload's closing boundary, then the upload's admission and chat concurrency.
Each refusal is the usual error envelope.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Collection, Iterable, Mapping

from fastapi import Request
from pydantic import SecretStr
from python_multipart.multipart import parse_options_header
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna.api.api_key import API_KEY_REQUIRED, SAFE_METHODS, request_has_key
from chatqna.api.errors import error_response
from chatqna.errors import (
    ChatQnAError,
    PayloadTooLarge,
    RequestTimeout,
    TooManyRequests,
    Unauthorized,
)

# Open without the key: only the health checks (probes carry no credentials).
PUBLIC_PATHS = frozenset({"/v1/health_check", "/v1/ready"})
# The chat UI's page and files. Refused without the key like the rest, but with a Basic
# challenge, so the browser asks for the key itself and then resends it on its own with
# every request to this origin, the page's API calls included.
UI_PATHS = frozenset({"/"})
UI_PREFIXES = ("/ui/",)
BASIC_CHALLENGE = 'Basic realm="ChatQnA", charset="UTF-8"'
SIGN_IN = "A valid API key is required: sign in with any user name and the key as the password."


def route_path(scope: Scope) -> str:
    """The path a request is routed on: without the `root_path` the app is mounted under.

    A server started with a root path (`uvicorn --root-path /chat`, `CHATQNA_ROOT_PATH`)
    puts the prefix in `scope["path"]` as well, and the router strips it; the guards, which
    run before the router, must strip it the same way or no path of theirs ever matches.
    """
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :] or "/"
    return path


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS


def asks_browser(method: str, path: str, headers: Headers) -> bool:
    """Whether a refusal should make a browser prompt: a read of the UI's paths, or of any
    page a user opens (a navigation, such as `/docs`). Scripts' API calls never get a Basic
    challenge, so a program (or the page's own `fetch`) is not interrupted by a dialog, and
    neither is a write, which Basic may not authorise from another site anyway."""
    if method.upper() not in SAFE_METHODS:
        return False
    navigation = headers.get("sec-fetch-mode", "").lower() == "navigate"
    return path in UI_PATHS or path.startswith(UI_PREFIXES) or navigation


def declares_body(headers: Headers) -> bool:
    """Whether a body follows the request's headers: a `Content-Length` above 0, or chunked."""
    length = headers.get("content-length", "")
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    return chunked or (length.isdigit() and int(length) > 0)


def is_json_media_type(content_type: str) -> bool:
    """`application/json` or a `+json` type (parameters and case aside): the types FastAPI
    parses a body as JSON for."""
    media_type = content_type.partition(";")[0].strip().lower()
    main, _, sub = media_type.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


async def require_json_body(request: Request) -> None:
    """A JSON endpoint's body comes as JSON, or the request is refused with 415
    (`unsupported_media_type`) before the body is parsed.

    FastAPI reads a body of another type (`text/plain`, curl's default
    `application/x-www-form-urlencoded`) as raw bytes and would report a schema mismatch
    (422); nor does it parse a body without a `Content-Type` as JSON (its
    `strict_content_type`). Refusing both also refuses the cross-site "simple" posts a
    browser sends without a CORS preflight. A request without a body is left to the
    schema."""
    content_type = request.headers.get("content-type", "")
    if is_json_media_type(content_type) or not declares_body(request.headers):
        return
    sent = f"'{content_type}'" if content_type else "none"
    raise HTTPException(
        415,
        detail=f"The request body must be JSON, sent with Content-Type: application/json "
        f"(Content-Type: {sent}).",
    )


async def refuse(
    error: ChatQnAError,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    body_read: bool = False,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Answer with `error`'s envelope. A refusal that leaves a declared body unread (all but
    those given `body_read`) closes the connection: a client that sent `Expect:
    100-continue` holds its body back once refused, and would have its next request on the
    connection taken for that body and never answered."""
    response = error_response(error)
    if not body_read and declares_body(Headers(scope=scope)):
        response.headers["Connection"] = "close"
    response.headers.update(headers or {})
    await response(scope, receive, send)


class ApiKeyGuard:
    """With `CHATQNA_API_KEY` set, every path but the health checks needs the key.

    It may come as `Authorization: Bearer <key>` or as Basic credentials with the key as the
    password (see `chatqna.api.api_key.request_has_key`, to which `own_hosts` goes). A
    refusal challenges Basic where a person is looking (see `asks_browser`), and Bearer
    elsewhere.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: SecretStr | None,
        own_hosts: Collection[str] = frozenset(),
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.own_hosts = frozenset(own_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.api_key is None or is_public(route_path(scope)):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if request_has_key(scope, self.api_key, own_hosts=self.own_hosts):
            await self.app(scope, receive, send)
            return
        if asks_browser(scope["method"], route_path(scope), headers):
            error, challenge = Unauthorized(SIGN_IN), BASIC_CHALLENGE
        else:
            error, challenge = Unauthorized(API_KEY_REQUIRED), "Bearer"
        await refuse(error, scope, receive, send, headers={"WWW-Authenticate": challenge})


UPLOAD_PATH = "/v1/dataprep/ingest"
FORM_DATA = b"multipart/form-data"


def multipart_form(headers: Headers) -> tuple[bool, bytes | None]:
    """Whether the body is `multipart/form-data`, and its boundary if it names one.

    Media types are case-insensitive (RFC 9110, 8.3.1): the form parser Starlette reads an
    upload with lowercases the type before comparing it, so `Multipart/Form-Data` is an
    upload too, and the guards must see it as one.
    """
    media_type, options = parse_options_header(headers.get("content-type", ""))
    return media_type.lower() == FORM_DATA, options.get(b"boundary")


class BodySizeLimit:
    """Refuses a request body beyond its limit with 413: `max_upload_bytes` for a multipart
    upload to `/v1/dataprep/ingest` (all its files together; each file is also held to
    `CHATQNA_MAX_UPLOAD_BYTES` by the route), `max_bytes` for any other body.

    A declared `Content-Length` is refused before the body is read; a chunked body is
    counted as the route reads it, so an upload stops being spooled once it is too large.

    It is not FastAPI's `max_body_size` (Starlette's `RequestBodyLimitMiddleware`): over a
    declared `Content-Length`, that replaces whatever response starts, this envelope as
    well as a 401 or a 429, with its own `text/plain` 413, which nothing can change; set on
    the app it sits outside every middleware here (CORS too). Its limits go by app, router
    or route (a route's fixed at import); these come from `Settings` and the content type.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_upload_bytes = max_upload_bytes

    def _limit(self, scope: Scope, headers: Headers) -> tuple[int, str]:
        """The limit on this request's body and the variable that sets it."""
        if route_path(scope) == UPLOAD_PATH and multipart_form(headers)[0]:
            return self.max_upload_bytes, "CHATQNA_MAX_UPLOAD_REQUEST_BYTES"
        return self.max_bytes, "CHATQNA_MAX_REQUEST_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit, variable = self._limit(scope, headers)
        error_text = f"The request body is larger than {limit} bytes ({variable})."
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await refuse(PayloadTooLarge(error_text), scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException is what FastAPI lets through from reading a body; the
                    # error handler renders it as the `payload_too_large` envelope.
                    raise HTTPException(413, detail=error_text)
            return message

        await self.app(scope, counted, send)


class UploadEndCheck:
    """Refuses (400) an upload to `/v1/dataprep/ingest` whose multipart body ends before its
    closing boundary (a client or proxy that cut it short).

    The form parser (python-multipart, through Starlette) drops an unfinished last part
    without a word, so the files before it would be ingested and the cut one silently
    left out; the closing delimiter is looked for as the body passes, in a window of its
    own length, and the final read raises when it never came.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) != UPLOAD_PATH:
            await self.app(scope, receive, send)
            return
        is_form, boundary = multipart_form(Headers(scope=scope))
        if not is_form or not boundary:
            await self.app(scope, receive, send)
            return
        close = b"\r\n--" + boundary + b"--"
        tail, closed = b"\r\n", False  # the body may open with the closing delimiter

        async def checked() -> Message:
            nonlocal tail, closed
            message = await receive()
            if message["type"] == "http.request" and not closed:
                window = tail + message.get("body", b"")
                closed = close in window
                tail = window[-len(close) :]
                if not closed and not message.get("more_body", False):
                    raise HTTPException(
                        400,
                        detail="The multipart body ends before its closing boundary: the "
                        "upload was cut short; send it again.",
                    )
            return message

        await self.app(scope, checked, send)


async def read_body(receive: Receive, timeout_seconds: float) -> list[Message] | None:
    """The request's body messages, read to its end within `timeout_seconds` (else
    `TimeoutError`); None when the client disconnects first."""
    messages: list[Message] = []
    async with asyncio.timeout(timeout_seconds):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            messages.append(message)
            if not message.get("more_body", False):
                return messages


def replaying(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that hands out `messages` first, then passes on to the real `receive`:
    the app reads the body as sent, and hears of the client's disconnect as before."""
    pending = deque(messages)

    async def replay() -> Message:
        if pending:
            return pending.popleft()
        return await receive()

    return replay


class ChatConcurrencyLimit:
    """At most `limit` chats in flight; a chat waits up to `queue_timeout_seconds` for a slot.

    A chat's body is read in full first, within `body_timeout_seconds` (else 408, with
    `Connection: close`), and only then does it take a slot: clients that send headers and
    then hold the body back hold no slot, however many they are. The body is handed on to
    the route as it came (and still counted against `BodySizeLimit` as it arrives).
    A slot is held until the answer has been sent (or the client has gone), so streamed
    answers count for their whole length. Without a free slot in time the request gets 429
    with `Retry-After`, rather than joining an unbounded queue.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        paths: Iterable[str],
        limit: int,
        queue_timeout_seconds: float,
        body_timeout_seconds: float,
    ) -> None:
        if limit < 1 or body_timeout_seconds <= 0:
            raise ValueError("limit must be at least 1 and body_timeout_seconds above 0")
        self.app = app
        self.paths = frozenset(paths)
        self.limit = limit
        self.queue_timeout_seconds = queue_timeout_seconds
        self.body_timeout_seconds = body_timeout_seconds
        self._slots = asyncio.Semaphore(limit)

    async def _acquire(self) -> bool:
        if not self._slots.locked():
            await self._slots.acquire()  # a slot is free: this does not wait
            return True
        if self.queue_timeout_seconds == 0:
            return False
        try:
            async with asyncio.timeout(self.queue_timeout_seconds):
                await self._slots.acquire()
        except TimeoutError:
            return False
        return True

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> list[Message] | None:
        """The chat's body; None when the client left, or was refused (413, 408)."""
        try:
            return await read_body(receive, self.body_timeout_seconds)
        except HTTPException as exc:  # `BodySizeLimit` counting a body without a length
            if exc.status_code != 413:
                raise
            await refuse(PayloadTooLarge(str(exc.detail)), scope, receive, send)
        except TimeoutError:
            error = RequestTimeout(
                f"The request body did not arrive within {self.body_timeout_seconds:g} "
                "seconds (CHATQNA_BODY_TIMEOUT_SECONDS)."
            )
            await refuse(error, scope, receive, send, headers={"Connection": "close"})
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) not in self.paths:
            await self.app(scope, receive, send)
            return
        body = await self._body(scope, receive, send)
        if body is None:
            return
        if not await self._acquire():
            error = TooManyRequests(
                f"The service is answering {self.limit} chats already "
                "(CHATQNA_MAX_CONCURRENT_CHATS); retry shortly."
            )
            await refuse(error, scope, receive, send, body_read=True)
            return
        try:
            await self.app(scope, replaying(body, receive), send)
        finally:
            self._slots.release()
