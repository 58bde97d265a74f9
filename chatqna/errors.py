"""The exception tree, and the one envelope every error is rendered as.

    ChatQnAError                      base; carries an HTTP status and an error code
    +-- InternalError             500 an unexpected failure; its details stay in the log
    +-- InvalidRequest        400/422 the request is malformed or breaks a rule
    |   +-- InvalidJson           400 the body is not valid JSON
    |   +-- InvalidHost           400 a `Host` the service does not answer to
    |   +-- PayloadTooLarge       413 a message or upload is beyond the configured limit
    |   |   +-- ContextTooLong    413 the answer prompt is longer than the LLM's context
    |   +-- UnsupportedFileType   415 an ingested file has a type we cannot read
    |   +-- DocumentLoadError     422 a supported file that yields no usable text
    |   |   +-- LinkUnreadable    422 a link that cannot be fetched (timeout, HTTP error...)
    |   +-- LinkRefused           403 a link to an address that is not allowed
    |   +-- RequestTimeout        408 a request body that did not arrive in time
    |       +-- ClientStalled     408 a streamed answer its client stopped reading
    +-- QueryNotSearchable        500 the index cannot parse the search the service built
    +-- NotFound                  404
    +-- Unauthorized              401 a missing or wrong API key
    +-- CrossSiteRequest          403 a write another site's page started in a browser
    +-- TooManyRequests           429 every chat or parsing slot is taken; retry after `Retry-After`
    +-- UpstreamFailure           5xx a backend (TEI, LLM server, index) failed
    |   +-- UpstreamTimeout       504 it did not answer in time
    |   +-- UpstreamError         502 it answered with an HTTP error or could not be reached
    |   +-- BadUpstreamResponse   502 it answered with a body we cannot use
    +-- CondenseFailed            503 the follow-up rewrite failed; the turn fails closed
    +-- NotSupported              501 not possible with this configuration
    +-- IndexUnavailable          503 the index cannot be read or written
    |   +-- EvictingIndexServer   503 Redis may evict keys (maxmemory-policy not noeviction)
    +-- ServiceUnavailable        503 the service is shutting down; retry on another instance
    +-- StartupFailed             a backend could not be built at start-up (never a response)

Clients and backends raise these (translating library exceptions with `raise ... from exc`);
`chatqna.api.errors` renders them, and only them, as
`{"error": code, "message": text, ["reason": ...], ["details": ...]}`.
"""

from __future__ import annotations

from typing import Any

CONDENSE_FAILED_MESSAGE = (
    "Query rewriting failed; this turn cannot be answered reliably. Please retry."
)


class ChatQnAError(Exception):
    """Base of every error the service reports to a client."""

    status_code: int = 500
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        details: Any = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.details = details
        if status_code is not None:
            self.status_code = status_code

    def envelope(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code}
        if self.reason is not None:
            body["reason"] = self.reason
        body["message"] = self.message
        if self.details is not None:
            body["details"] = self.details
        return body


class InternalError(ChatQnAError):
    """What a client is told of an unexpected failure (a bug): nothing but that it happened.
    The exception itself goes to the log."""

    status_code = 500
    code = "internal_error"

    def __init__(self, message: str = "An unexpected error occurred.") -> None:
        super().__init__(message)


class InvalidRequest(ChatQnAError):
    """The request is malformed (bad JSON, wrong shape) or breaks a documented rule."""

    status_code = 400
    code = "invalid_request"


class InvalidJson(InvalidRequest):
    """The request body is not valid JSON (or not UTF-8, or nested too deep to decode)."""

    code = "invalid_json"

    def __init__(self, message: str = "The request body is not valid JSON.") -> None:
        super().__init__(message)


class InvalidHost(InvalidRequest):
    """The request's `Host` header names a host the service does not answer to
    (`CHATQNA_ALLOWED_HOSTS`), or is missing or malformed: another site's name pointed at
    the service's address (DNS rebinding), or a proxy that passes on a name not listed.
    See `chatqna.api.hosts`."""

    code = "invalid_host"

    def __init__(
        self,
        message: str = "The service does not answer to the host this request names in its "
        "Host header (CHATQNA_ALLOWED_HOSTS lists those it does).",
    ) -> None:
        super().__init__(message)


class PayloadTooLarge(InvalidRequest):
    """A message or an upload is larger than the configured limit."""

    status_code = 413
    code = "payload_too_large"


class ContextTooLong(PayloadTooLarge):
    """The LLM refused the prompt as longer than its context window: the question, the
    conversation and the passages together (or a rewrite or translation prompt)."""

    code = "context_too_long"


class UnsupportedFileType(InvalidRequest):
    """An ingested file's type is not one the loaders read."""

    status_code = 415
    code = "unsupported_file_type"


class DocumentLoadError(InvalidRequest):
    """A file of a supported type that cannot be read or holds no text."""

    status_code = 422
    code = "document_unreadable"


class LinkUnreadable(DocumentLoadError):
    """A `link_list` URL that could not be fetched; `reason` says why, `details` names it."""

    code = "link_unreadable"


class LinkRefused(InvalidRequest):
    """A `link_list` URL (or a redirect) that leads to an address the service does not
    fetch from: loopback, private, link-local, a cloud metadata address, or an unusable
    scheme. `CHATQNA_DATAPREP_LINK_ALLOWLIST` opens named hosts and networks."""

    status_code = 403
    code = "link_refused"


class RequestTimeout(InvalidRequest):
    """A request's body did not arrive in time (`CHATQNA_BODY_TIMEOUT_SECONDS`): a chat's
    whole body, or the next part of an upload's body after a pause; a client too slow, or
    one holding its connection open without sending. Answered with `Connection: close`,
    since the rest of the body may still be on its way."""

    status_code = 408
    code = "request_timeout"


class ClientStalled(RequestTimeout):
    """A client that stopped reading its streamed answer without disconnecting, until the
    answer's deadline (`LLM_GENERATION_TIMEOUT_SECONDS`): the answer was stopped there and
    its LLM call closed. The client's doing, not the LLM's: no upstream error is counted,
    and the turn's spans carry `chatqna.client_stalled` instead of an error status. A
    client that reads on gets it as the stream's `event: error`."""


class QueryNotSearchable(ChatQnAError):
    """The index refused the search built from the request's text as a query it cannot
    parse (a RediSearch syntax error). The query builder keeps every message within the
    limits searchable, so this is a fault of the service on a text it failed on (a 500, to
    be reported), not a bad request and not an index outage."""

    status_code = 500
    code = "query_not_searchable"


class NotFound(ChatQnAError):
    """The named resource does not exist."""

    status_code = 404
    code = "not_found"


class Unauthorized(ChatQnAError):
    """The request lacks the API key, or carries a wrong one."""

    status_code = 401
    code = "unauthorized"


class CrossSiteRequest(ChatQnAError):
    """A write (POST, or any method but GET, HEAD and OPTIONS) that another site's page
    started in a browser: a form it submitted, or a script's call. Such a request carries
    what the browser adds on its own (a cached sign-in) and reaches the service without
    any CORS check, so it is refused (cross-site request forgery); sites listed in
    `CHATQNA_CORS_ORIGINS` may write. See `chatqna.api.origins`."""

    status_code = 403
    code = "cross_site_request"


class TooManyRequests(ChatQnAError):
    """Every chat slot (`CHATQNA_MAX_CONCURRENT_CHATS`) stayed taken for the queue timeout,
    or dataprep's parsing threads are busy and its queue is full.

    Answered with a `Retry-After` header instead of queueing without bound; OpenAI clients
    retry a 429 on their own.
    """

    status_code = 429
    code = "too_many_requests"
    retry_after_seconds = 1


class UpstreamFailure(ChatQnAError):
    """A backend failed; `backend` names the role (embedder, reranker, llm, retriever)."""

    status_code = 502
    code = "upstream_error"

    def __init__(self, message: str, *, backend: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.backend = backend

    def envelope(self) -> dict[str, Any]:
        body = super().envelope()
        body["backend"] = self.backend
        return body


class UpstreamTimeout(UpstreamFailure):
    """The backend did not answer within its configured timeout."""

    status_code = 504
    code = "upstream_timeout"


class UpstreamError(UpstreamFailure):
    """The backend answered with an HTTP error status or could not be reached."""

    code = "upstream_error"


class BadUpstreamResponse(UpstreamFailure):
    """The backend answered, but its body is not the documented shape."""

    code = "bad_upstream_response"


class CondenseFailed(ChatQnAError):
    """The condense rewrite failed; the turn fails closed with HTTP 503 and no fallback.

    `reason` is one of `timeout`, `http_error`, `bad_body`, `missing_field`, `empty_query`.
    """

    status_code = 503
    code = "condense_failed"
    REASONS = ("timeout", "http_error", "bad_body", "missing_field", "empty_query")

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown condense failure reason {reason!r}")
        super().__init__(CONDENSE_FAILED_MESSAGE, reason=reason)
        self.detail = detail
        # Filled in by the condense step, for logs, spans and metrics.
        self.latency_ms = 0.0
        self.history_size = 0
        self.model: str | None = None


class NotSupported(ChatQnAError):
    """The operation exists, but not in this configuration (ingest via a remote retriever)."""

    status_code = 501
    code = "not_supported"


class IndexUnavailable(ChatQnAError):
    """The index cannot be read or written (corrupt file, wrong embedding dimension...)."""

    status_code = 503
    code = "index_unavailable"


class EvictingIndexServer(IndexUnavailable):
    """Redis runs with a `maxmemory-policy` that evicts keys: under memory pressure it would
    silently drop passages and their listings, leaving the index half-visible, so the store
    refuses to open on it."""

    code = "index_server_evicts"


class ServiceUnavailable(ChatQnAError):
    """The service is shutting down: work that reaches it after its pools have closed (a
    request still in flight when the process was told to stop) is refused, not failed with
    a 500."""

    status_code = 503
    code = "service_unavailable"

    @classmethod
    def closed(cls, what: str) -> ServiceUnavailable:
        """The refusal of work that reaches `what` (an index, say) after it was closed."""
        return cls(f"{what} is closed: the service is shutting down; retry on another instance.")


class StartupFailed(ChatQnAError):
    """A backend could not be built when the service started: an endpoint that does not
    answer, a model file that cannot be loaded, an index that cannot be opened. The message
    starts with the variable that configures it (`REDIS_URL: ...`), so the operator sees one
    line to act on instead of a traceback."""

    status_code = 503
    code = "startup_failed"
