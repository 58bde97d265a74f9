"""The API key check: Bearer or Basic, compared as the bytes sent; Basic for a write only
from this origin."""

from __future__ import annotations

import base64

import pytest
from pydantic import SecretStr
from starlette.datastructures import Headers

from chatqna.api.api_key import api_key_matches, basic_password, request_has_key

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


@pytest.mark.parametrize(
    ("method", "site", "accepted"),
    [
        ("GET", "cross-site", True),  # a read changes nothing
        ("POST", None, True),  # no browser sent it
        ("POST", "same-origin", True),
        ("POST", "none", True),  # the user typed it
        ("POST", "cross-site", False),
        ("post", "same-site", False),
        ("DELETE", "Cross-Site", False),
    ],
)
def test_basic_authorises_a_write_only_from_this_origin(
    method: str, site: str | None, accepted: bool
) -> None:
    fields = {"authorization": basic("me", "s3cret")}
    if site is not None:
        fields["sec-fetch-site"] = site
    assert request_has_key(Headers(fields), method, KEY) is accepted


def test_bearer_counts_from_any_site_and_nothing_counts_without_a_header() -> None:
    bearer = Headers({"authorization": "Bearer s3cret", "sec-fetch-site": "cross-site"})
    assert request_has_key(bearer, "POST", KEY)
    assert not request_has_key(Headers({}), "GET", KEY)
    wrong = Headers({"authorization": "Bearer s3cre7"})
    assert not request_has_key(wrong, "GET", KEY)
