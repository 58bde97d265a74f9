"""Telling another site's request from this origin's own, with and without `Sec-Fetch-Site`."""

from __future__ import annotations

import pytest
from starlette.types import Scope

from chatqna.api.origins import (
    cross_site,
    own_host_names,
    parse_origin,
    request_origin,
    started_here,
)


def scope(host: str | None = "chat.internal:8888", scheme: str = "http", **fields: str) -> Scope:
    headers = [(name.replace("_", "-").encode(), value.encode()) for name, value in fields.items()]
    if host is not None:
        headers.append((b"host", host.encode()))
    return {"type": "http", "method": "POST", "scheme": scheme, "headers": headers}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("http://chat.internal:8888", ("http", "chat.internal", 8888)),
        ("HTTPS://Chat.Internal", ("https", "chat.internal", 443)),
        ("http://[::1]:8888", ("http", "::1", 8888)),
        ("http://chat.internal:80", ("http", "chat.internal", 80)),
        ("null", None),
        ("file://", None),
        ("http://", None),
        ("http://chat.internal:99999", None),
        ("http://chat.internal/path", None),
        ("http://user@chat.internal", None),
    ],
)
def test_an_origin_is_a_scheme_a_host_and_a_port(text: str, parsed: object) -> None:
    assert parse_origin(text) == parsed


def test_the_request_s_own_origin_is_its_scheme_and_host_header() -> None:
    assert request_origin(scope()) == ("http", "chat.internal", 8888)
    assert request_origin(scope("chat.internal", scheme="https")) == ("https", "chat.internal", 443)
    assert request_origin(scope("[::1]:8888")) == ("http", "::1", 8888)
    assert request_origin(scope(None)) is None


@pytest.mark.parametrize(
    ("fields", "here"),
    [
        ({}, True),  # no browser: curl, a gateway, Python
        ({"sec_fetch_site": "same-origin"}, True),
        ({"sec_fetch_site": "none"}, True),  # the user typed the address
        ({"sec_fetch_site": "Same-Origin"}, True),
        ({"sec_fetch_site": "same-site"}, False),
        ({"sec_fetch_site": "cross-site"}, False),
        # Sec-Fetch-Site wins: the browser sets it, and a page cannot.
        ({"sec_fetch_site": "cross-site", "origin": "http://chat.internal:8888"}, False),
        # Plain HTTP to a host that is not localhost: the browser sends only Origin.
        ({"origin": "http://chat.internal:8888"}, True),
        ({"origin": "http://CHAT.internal:8888"}, True),
        ({"origin": "http://evil.example"}, False),
        ({"origin": "http://chat.internal:8889"}, False),
        ({"origin": "https://chat.internal:8888"}, False),  # another scheme
        ({"origin": "http://chat.internal"}, False),  # port 80
        ({"origin": "null"}, False),  # a sandboxed frame, a data: page
        ({"origin": "garbage"}, False),
    ],
)
def test_a_request_started_here_is_named_so_by_the_browser_or_by_its_origin(
    fields: dict[str, str], here: bool
) -> None:
    assert started_here(scope(**fields)) is here


def test_without_a_host_header_no_origin_is_this_one() -> None:
    assert not started_here(scope(None, origin="http://chat.internal:8888"))
    assert started_here(scope(None))


def test_the_default_port_is_the_scheme_s_on_both_sides() -> None:
    assert started_here(scope("chat.internal", origin="http://chat.internal:80"))
    secure = scope("chat.internal", scheme="https", origin="https://chat.internal")
    assert started_here(secure)


ALLOWED = ["https://admin.example.com", "http://tools.internal:3000"]


@pytest.mark.parametrize(
    ("fields", "crossing"),
    [
        ({}, False),
        ({"origin": "http://chat.internal:8888"}, False),
        ({"origin": "http://evil.example"}, True),
        ({"origin": "https://admin.example.com"}, False),  # listed for CORS
        ({"origin": "https://ADMIN.example.com:443"}, False),
        ({"origin": "http://admin.example.com"}, True),  # listed with https only
        ({"origin": "http://tools.internal:3000", "sec_fetch_site": "same-site"}, False),
        ({"sec_fetch_site": "cross-site"}, True),  # no Origin to find in the list
        ({"origin": "null"}, True),
    ],
)
def test_a_cross_site_request_is_one_from_a_site_not_listed(
    fields: dict[str, str], crossing: bool
) -> None:
    assert cross_site(scope(**fields), ALLOWED) is crossing


def test_any_origin_is_allowed_by_a_star_but_null_is_not() -> None:
    assert not cross_site(scope(origin="http://evil.example"), ["*"])
    assert cross_site(scope(origin="null"), ["*"])
    assert cross_site(scope(origin="http://evil.example"), [])


def test_own_host_names_are_the_exact_names_listed_but_loopback_ones() -> None:
    listed = ["chat.example.com", "*.example.com", "*", "localhost", "127.0.0.1", "[::1]"]
    listed += ["10.0.0.5", "[2001:DB8:0::1]"]
    assert own_host_names(listed) == {"chat.example.com", "10.0.0.5", "2001:db8::1"}
    assert own_host_names([]) == frozenset()


# Behind a proxy that rewrites `Host` to `backend:8888`, its public name listed.
PROXIED = "backend:8888"
OWN_HOSTS = own_host_names(["chat.example.com", "*.example.com", "[2001:db8::1]"])


@pytest.mark.parametrize(
    ("fields", "here"),
    [
        ({"origin": "http://chat.example.com"}, True),
        ({"origin": "http://Chat.Example.com:8080"}, True),  # any port of a listed name
        ({"origin": "http://[2001:db8::1]"}, True),
        ({"origin": "https://chat.example.com"}, False),  # not the request's scheme
        ({"origin": "http://other.example.com"}, False),  # a wildcard names no origin
        ({"origin": "http://example.com"}, False),
        ({"origin": "http://chat.example.com.evil.example"}, False),
        ({"origin": "http://localhost:3000"}, False),  # any program on the user's machine
        ({"origin": "http://backend:8888"}, True),  # the request's own, as before
        ({"origin": "null"}, False),
        # Sec-Fetch-Site still wins where the browser sends it.
        ({"origin": "http://chat.example.com", "sec_fetch_site": "cross-site"}, False),
    ],
)
def test_an_origin_on_a_listed_name_is_this_service_s_own(
    fields: dict[str, str], here: bool
) -> None:
    assert started_here(scope(PROXIED, **fields), own_hosts=OWN_HOSTS) is here
    assert cross_site(scope(PROXIED, **fields), [], own_hosts=OWN_HOSTS) is not here


def test_without_listed_names_a_rewritten_host_hides_the_origin() -> None:
    assert not started_here(scope(PROXIED, origin="http://chat.example.com"))
    assert cross_site(scope(PROXIED, origin="http://chat.example.com"), [])
