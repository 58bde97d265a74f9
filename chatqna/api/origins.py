"""Which site started a request: this origin's own pages, another site's, or no browser.

A browser names the site whose page started a request in `Sec-Fetch-Site`, but only to a
secure origin (HTTPS, `localhost`, 127.0.0.0/8); over plain HTTP to any other host it sends
none. What is left there is `Origin`, which browsers send with every write (a form's POST
and a script's call, same-origin ones included) and compare to nothing themselves; `null`
stands for an opaque origin (a sandboxed frame, a `data:` page) and is never this one.
Programs (curl, OPEA's gateways, Python clients) send neither header.

A request's own origin is its scheme and its `Host` header. The scheme is the one the
server puts in the ASGI scope: uvicorn takes it from `X-Forwarded-Proto` only when the
connection comes from a proxy it trusts (`FORWARDED_ALLOW_IPS`, 127.0.0.1 by default), and
nothing here reads `X-Forwarded-Host`. A proxy that rewrites `Host` over plain HTTP hides
the origin the browser saw; its public origin then goes in `CHATQNA_CORS_ORIGINS`.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import Scope

# `Sec-Fetch-Site` values of a request this origin's own pages (or the user) started.
OWN_SITE = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]


def parse_origin(text: str) -> Origin | None:
    """`scheme://host[:port]` as (scheme, host, port), lower-cased, the port the scheme's
    default when not given; None for `null` or for anything that is not such an origin."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    extra = parts.path or parts.query or parts.fragment or "@" in parts.netloc
    if scheme not in DEFAULT_PORTS or not parts.hostname or extra:
        return None
    return scheme, parts.hostname, DEFAULT_PORTS[scheme] if port is None else port


def request_origin(scope: Scope) -> Origin | None:
    """The origin the request was sent to: the scope's scheme and the `Host` header."""
    host = Headers(scope=scope).get("host")
    if host is None:
        return None
    return parse_origin(f"{scope.get('scheme', 'http')}://{host}")


def started_here(scope: Scope) -> bool:
    """Whether no other site's page started the request: the browser says this origin (or
    the user) did, or, without `Sec-Fetch-Site`, `Origin` is absent (no browser) or this
    request's own."""
    headers = Headers(scope=scope)
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site.strip().lower() in OWN_SITE
    origin = headers.get("origin")
    if origin is None:
        return True
    own = parse_origin(origin)
    return own is not None and own == request_origin(scope)


def allowed_origin(origin: str | None, allowed: Collection[str]) -> bool:
    """Whether `origin` is one of `allowed` (the CORS origins; `*` is any but `null`)."""
    parsed = None if origin is None else parse_origin(origin)
    if parsed is None:
        return False
    return "*" in allowed or parsed in {parse_origin(entry) for entry in allowed}


def cross_site(scope: Scope, allowed: Collection[str]) -> bool:
    """Whether another site's page started the request, one not listed in `allowed`."""
    if started_here(scope):
        return False
    return not allowed_origin(Headers(scope=scope).get("origin"), allowed)
