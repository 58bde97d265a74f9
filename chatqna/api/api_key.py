"""The API key: how a request carries it, and how it is compared.

With `CHATQNA_API_KEY` set, a request carries the key as `Authorization: Bearer <key>` (API
clients) or as the password of HTTP Basic credentials (the browser's own sign-in prompt, for
the chat UI). `chatqna.api.guards.ApiKeyGuard` checks it on every path, and
`chatqna.api.deps.require_api_key` again on the routers that serve data.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Collection

from pydantic import SecretStr
from starlette.datastructures import Headers
from starlette.types import Scope

from chatqna.api.origins import started_here

API_KEY_REQUIRED = "A valid API key is required: send 'Authorization: Bearer <key>'."
# Methods that change nothing; a write needs more than credentials the browser adds itself.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def basic_password(credentials: bytes) -> bytes | None:
    """The password of `Basic <base64(user:password)>` credentials; None when malformed."""
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    _, colon, password = decoded.partition(b":")
    return password if colon else None


def api_key_matches(header: str | None, key: SecretStr, *, basic: bool = True) -> bool:
    """True for `Bearer <key>` (OpenAI's convention) or, with `basic`, Basic credentials whose
    password is the key (any user name); compared in constant time."""
    try:
        # Header values arrive decoded as Latin-1; encoding back gives the bytes as sent
        # (UTF-8 from a browser, whose prompt the challenge's `charset="UTF-8"` asks for).
        raw = (header or "").strip().encode("latin-1")
    except UnicodeEncodeError:
        return False
    scheme, _, credentials = raw.partition(b" ")
    offered: bytes | None = None
    if scheme.lower() == b"bearer":
        offered = credentials.strip()
    elif scheme.lower() == b"basic" and basic:
        offered = basic_password(credentials)
    expected = key.get_secret_value().encode()
    return offered is not None and secrets.compare_digest(offered, expected)


def request_has_key(
    scope: Scope, key: SecretStr, *, own_hosts: Collection[str] = frozenset()
) -> bool:
    """Whether a request carries the key.

    A browser resends Basic credentials it has cached on its own, also on a form another
    site posts here (cross-site request forgery). So for a write, Basic counts only when no
    other site's page started the request (`chatqna.api.origins.started_here`: the browser
    says so in `Sec-Fetch-Site`, or over plain HTTP, where it sends none, `Origin` is absent
    or this request's own, which includes an origin on one of `own_hosts`, the public names
    of `CHATQNA_ALLOWED_HOSTS` that a proxy rewriting `Host` hides). A site merely listed in
    `CHATQNA_CORS_ORIGINS` is not this origin: its pages call with Bearer. Bearer is never
    added by a browser, so it always counts.
    """
    headers = Headers(scope=scope)
    basic = scope["method"].upper() in SAFE_METHODS or started_here(scope, own_hosts=own_hosts)
    return api_key_matches(headers.get("authorization"), key, basic=basic)
