"""The API key check: Bearer or Basic, compared as the bytes sent; Basic for a write only
from this origin, told by `Sec-Fetch-Site` or, over plain HTTP, by `Origin`."""

from __future__ import annotations

import base64

import pytest
from pydantic import SecretStr
from starlette.types import Scope

from chatqna.api.api_key import api_key_matches, basic_password, request_has_key
from chatqna.api.origins import own_host_names

KEY = SecretStr("s3cret")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        # Header values reach the app decoded as Latin-1; the key's UTF-8 bytes must match.
        ("Bearer " + "schlüssel".encode().decode("latin-1"), True),
        ("Basic " + base64.b64encode("me:schlüssel".encode()).decode(), True),
        ("Basic " + base64.b64encode(b"me:schluessel").decode(), False),
        ("Basic " + base64.b64encode("me:schlüssel:".encode()).decode(), False),
        ("Basic !!", False),
        ("Bearer schlüssel", False),  # Latin-1 bytes, not the key's UTF-8 ones
        ("Bearer ключ", False),  # no HTTP header could carry this string
        (None, False),
    ],
)
def test_the_key_is_compared_as_the_bytes_sent(header: str | None, accepted: bool) -> None:
    assert api_key_matches(header, SecretStr("schlüssel")) is accepted


def test_basic_password_is_what_follows_the_first_colon() -> None:
    assert basic_password(base64.b64encode(b"any:pass:word")) == b"pass:word"
    assert basic_password(base64.b64encode(b":")) == b""
    assert basic_password(base64.b64encode(b"no colon")) is None
    assert basic_password(b"not base64!") is None


def test_basic_counts_only_where_asked() -> None:
    assert api_key_matches(basic("me", "s3cret"), KEY)
    assert not api_key_matches(basic("me", "s3cret"), KEY, basic=False)
    assert api_key_matches("bearer s3cret", KEY, basic=False)  # the scheme in any case


def request(method: str, **fields: str) -> Scope:
    """An HTTP scope sent to http://chat.internal:8888 with the given headers."""
    headers = [(name.replace("_", "-").encode(), value.encode()) for name, value in fields.items()]
    headers.append((b"host", b"chat.internal:8888"))
    return {"type": "http", "method": method, "scheme": "http", "headers": headers}


@pytest.mark.parametrize(
    ("method", "fields", "accepted"),
    [
        ("GET", {"sec_fetch_site": "cross-site"}, True),  # a read changes nothing
        ("GET", {"origin": "http://evil.example"}, True),
        ("POST", {}, True),  # no browser sent it
        ("POST", {"sec_fetch_site": "same-origin"}, True),
        ("POST", {"sec_fetch_site": "none"}, True),  # the user typed it
        ("POST", {"sec_fetch_site": "cross-site"}, False),
        ("post", {"sec_fetch_site": "same-site"}, False),
        ("DELETE", {"sec_fetch_site": "Cross-Site"}, False),
        # Plain HTTP to a host that is not localhost: no Sec-Fetch-Site, only Origin.
        ("POST", {"origin": "http://chat.internal:8888"}, True),
        ("POST", {"origin": "http://evil.example"}, False),
        ("POST", {"origin": "http://chat.internal:8889"}, False),
        ("POST", {"origin": "null"}, False),
    ],
)
def test_basic_authorises_a_write_only_from_this_origin(
    method: str, fields: dict[str, str], accepted: bool
) -> None:
    scope = request(method, authorization=basic("me", "s3cret"), **fields)
    assert request_has_key(scope, KEY) is accepted


def test_bearer_counts_from_any_site_and_nothing_counts_without_a_header() -> None:
    assert request_has_key(request("POST", authorization="Bearer s3cret", origin="null"), KEY)
    bearer = request("POST", authorization="Bearer s3cret", sec_fetch_site="cross-site")
    assert request_has_key(bearer, KEY)
    assert not request_has_key(request("GET"), KEY)
    assert not request_has_key(request("GET", authorization="Bearer s3cre7"), KEY)


@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        ("http://chat.example.com", True),  # the proxy's public name, listed
        ("http://chat.example.com:8080", True),
        ("http://chat.internal:8888", True),  # the request's own, as before
        ("https://chat.example.com", False),  # another scheme
        ("http://evil.example", False),
        ("http://admin.example.com", False),  # listed only by a wildcard
    ],
)
def test_basic_authorises_a_write_from_a_listed_public_name(origin: str, accepted: bool) -> None:
    """Behind a proxy that rewrites `Host` (here to chat.internal:8888), the browser's
    `Origin` is the proxy's public one."""
    own_hosts = own_host_names(["chat.example.com", "*.example.com"])
    scope = request("POST", authorization=basic("me", "s3cret"), origin=origin)
    assert request_has_key(scope, KEY, own_hosts=own_hosts) is accepted
