"""The error envelope's wire model, and the error responses each route declares.

Every error a client gets is one `ErrorEnvelope` (`chatqna.api.errors` renders it).
`error_responses` declares the statuses a route can answer in its OpenAPI entry, each
described by the codes it carries, so the published schema names every error a client can
get; `ANY_ROUTE` are those every route can answer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorEnvelope(BaseModel):
    """The one error body every endpoint returns; `backend` names a failing upstream role."""

    error: str
    reason: str | None = None
    message: str
    details: Any = None
    backend: str | None = None


_DESCRIPTIONS = {
    400: (
        "Malformed request (`invalid_json`), a broken rule (`invalid_request`), or a `Host` "
        "the service does not answer to (`invalid_host`)"
    ),
    401: "Missing or wrong API key (`unauthorized`), when CHATQNA_API_KEY is set",
    403: (
        "Another site's page sent this write from a browser (`cross_site_request`), or a "
        "`link_list` URL leads to an address that is not allowed (`link_refused`)"
    ),
    404: "No such resource (`not_found`)",
    408: (
        "A chat's body did not arrive within CHATQNA_BODY_TIMEOUT_SECONDS, or an upload's "
        "body paused for longer (`request_timeout`)"
    ),
    413: "A message, the request or an upload is beyond its limit (`payload_too_large`)",
    415: (
        "A body that is not sent as `application/json` to a JSON endpoint "
        "(`unsupported_media_type`), or an uploaded file type that cannot be read "
        "(`unsupported_file_type`)"
    ),
    422: (
        "The request does not match the schema (`invalid_request`, with `details`), a file "
        "cannot be read (`document_unreadable`) or a link cannot be fetched (`link_unreadable`)"
    ),
    429: (
        "Every chat slot is taken, or every upload parsing slot and its queue "
        "(`too_many_requests`); retry after `Retry-After`"
    ),
    500: (
        "An unexpected error (`internal_error`), or a search the index could not parse "
        "(`query_not_searchable`)"
    ),
    501: "Not possible in this configuration (`not_supported`)",
    502: "A backend failed or answered with an unusable body (`upstream_error`, ...)",
    503: (
        "The index is unavailable, the follow-up rewrite failed (`condense_failed`), or "
        "the service is shutting down (`service_unavailable`)"
    ),
    504: "A backend did not answer in time (`upstream_timeout`)",
}


# What any route can answer: a `Host` the service does not answer to and a body beyond
# CHATQNA_MAX_REQUEST_BYTES are refused in front of every route (`chatqna.api.hosts.HostGuard`,
# `chatqna.api.guards.BodySizeLimit`), whatever its method, and any route can fail.
ANY_ROUTE = (400, 413, 500)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries: each status is answered with the error envelope."""
    return {
        status: {"model": ErrorEnvelope, "description": _DESCRIPTIONS[status]}
        for status in statuses
    }
