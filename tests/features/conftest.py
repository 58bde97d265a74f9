"""Feature suites: the whole app driven through `httpx2.ASGITransport` on in-process backends.

They reuse the unit tests' fixtures (the app client, settings, the in-memory span exporter)
and their guards: no network, and no ChatQnA variable leaking in from the environment.
"""

from typing import Any

import respx

from tests.unit.api.conftest import client_for, settings
from tests.unit.conftest import _clean_environment, _no_network, _no_proxies, spans


def upstream_mock(**options: Any) -> respx.MockRouter:
    """A respx router for the upstreams, at httpcore2's connection pool (the `httpcore2`
    mocker that pytest-httpx2 adds to respx): it routes the requests of every client on
    httpx2's own transport, as the upstream clients are; the app client's requests, on
    `httpx2.ASGITransport`, never reach a pool and go to the app. Routes answer with
    respx's (httpx) responses, which the pool hands on to httpx2 as any response."""
    return respx.mock(using="httpcore2", **options)


__all__ = [
    "_clean_environment",
    "_no_network",
    "_no_proxies",
    "client_for",
    "settings",
    "spans",
    "upstream_mock",
]
