"""`CrossSiteGuard`: refuses a write that another site's page started in a browser.

A form another site submits, or a `fetch` with a "simple" body (a multipart upload to
`/v1/dataprep/ingest`, say), reaches the service without a CORS preflight: CORS only keeps
that site from reading the answer, not the request from having its effect. Without an API
key (the loopback default) any page the user visits could add documents to the index;
with one, the browser's cached sign-in goes along. So every write (any method but GET,
HEAD and OPTIONS) that a browser says another site started is refused with 403
`cross_site_request`, whether or not a key is set; how that is told is
`chatqna.api.origins` (whose own origins include the public names the operator lists in
`CHATQNA_ALLOWED_HOSTS`, for a proxy that rewrites `Host`). Sites listed in
`CHATQNA_CORS_ORIGINS` may write, as CORS lets them. Programs send neither
`Sec-Fetch-Site` nor `Origin`, and pass; so does a request that carries a Bearer token (a
browser adds no `Authorization` header by itself, and a page of another site that sets one
must pass a CORS preflight first), whose key the API key guard then checks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from chatqna.api.api_key import SAFE_METHODS
from chatqna.api.guards import refuse
from chatqna.api.origins import cross_site
from chatqna.errors import CrossSiteRequest

CROSS_SITE_REFUSAL = (
    "Another site's page cannot send this request: only this origin's pages, programs that "
    "are no browser, and the sites in CHATQNA_CORS_ORIGINS may change data."
)


def bearer(scope: Scope) -> bool:
    """Whether the request carries `Authorization: Bearer ...`, which no browser adds itself."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bytes(value[:7]).lower() == b"bearer "
    return False


class CrossSiteGuard:
    """Refuses (403) a write another site's page started, unless that site is one of
    `allowed_origins` (the CORS origins); a page on one of `own_hosts` (see
    `chatqna.api.origins.own_host_names`) is this service's own."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_origins: Iterable[str],
        own_hosts: Collection[str] = frozenset(),
    ) -> None:
        self.app = app
        self.allowed_origins = tuple(allowed_origins)
        self.own_hosts = frozenset(own_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"].upper() in SAFE_METHODS
            or bearer(scope)
            or not cross_site(scope, self.allowed_origins, own_hosts=self.own_hosts)
        ):
            await self.app(scope, receive, send)
            return
        await refuse(CrossSiteRequest(CROSS_SITE_REFUSAL), scope, receive, send)
