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
nothing here reads `X-Forwarded-Host`.

A proxy that rewrites `Host` over plain HTTP (`proxy_pass http://backend:8888` without
passing `Host` on) hides the origin the browser saw: its pages' writes carry
`Origin: http://chat.example.com` to a request whose `Host` is `backend:8888`. So an
`Origin` whose host is one of the exact names `CHATQNA_ALLOWED_HOSTS` lists
(`own_host_names`), with the request's scheme and on any port, is this service's own too,
for the cross-site guard and for the browser's Basic sign-in alike: the operator lists
there the names the service is reached by, and a proxy's public name is one of them.

Another site's page can still never ride on the cached sign-in: a page cannot set
`Origin`, so only a page served from a listed name carries one, and such a page is the
operator's own site. Left out are the entries that name sites the operator may not
control: `*`, `*.example.com` (a subdomain may serve other people's pages) and the loopback
names (any program on the user's machine serves pages there). Any port counts, as the
`Host` check ignores ports too; a name whose other ports serve pages nobody vouches for
does not belong in the list. The scheme must be the request's, so a plain-HTTP page (which
anyone on the network can forge) never vouches for an HTTPS request. A site in
`CHATQNA_CORS_ORIGINS` is another site that the operator lets call the API, not this one:
it may write past the cross-site guard, but its pages send the key as Bearer.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable
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


def canonical_host(host: str) -> str:
    """A host name lower-cased, an IP address in its short form without brackets."""
    name = host.strip("[]").lower()
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def own_host_names(allowed_hosts: Iterable[str]) -> frozenset[str]:
    """The names of `CHATQNA_ALLOWED_HOSTS` (its entries as given, not the defaults) that an
    `Origin` may carry and be this service's own: each exact one, but no `*`, no
    `*.domain` and no loopback name or address (see the module's docstring)."""
    names = set()
    for entry in allowed_hosts:
        if entry.startswith("*"):
            continue
        name = canonical_host(entry)
        try:
            loopback = name == "localhost" or ipaddress.ip_address(name).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            names.add(name)
    return frozenset(names)


def own_origin(origin: Origin, scope: Scope, own_hosts: Collection[str]) -> bool:
    """Whether `origin` is this request's own: its scheme and `Host` header, or its scheme
    and a name of `own_hosts` (any port)."""
    if origin == request_origin(scope):
        return True
    scheme, host, _ = origin
    return scheme == scope.get("scheme", "http") and canonical_host(host) in own_hosts


def started_here(scope: Scope, *, own_hosts: Collection[str] = frozenset()) -> bool:
    """Whether no other site's page started the request: the browser says this origin (or
    the user) did, or, without `Sec-Fetch-Site`, `Origin` is absent (no browser) or this
    request's own (`own_origin`, with the names of `own_host_names`)."""
    headers = Headers(scope=scope)
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site.strip().lower() in OWN_SITE
    origin = headers.get("origin")
    if origin is None:
        return True
    parsed = parse_origin(origin)
    return parsed is not None and own_origin(parsed, scope, own_hosts)


def allowed_origin(origin: str | None, allowed: Collection[str]) -> bool:
    """Whether `origin` is one of `allowed` (the CORS origins; `*` is any but `null`)."""
    parsed = None if origin is None else parse_origin(origin)
    if parsed is None:
        return False
    return "*" in allowed or parsed in {parse_origin(entry) for entry in allowed}


def cross_site(
    scope: Scope, allowed: Collection[str], *, own_hosts: Collection[str] = frozenset()
) -> bool:
    """Whether another site's page started the request, one not listed in `allowed` (nor
    on a name of `own_hosts`, which is this service's own)."""
    if started_here(scope, own_hosts=own_hosts):
        return False
    return not allowed_origin(Headers(scope=scope).get("origin"), allowed)
