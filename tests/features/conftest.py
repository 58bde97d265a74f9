"""Feature suites: the whole app driven through `httpx.ASGITransport` on in-process backends.

They reuse the unit tests' fixtures (the app client, settings, the in-memory span exporter)
and their guards: no network, and no ChatQnA variable leaking in from the environment.
"""

from typing import Any

import respx

from tests.unit.api.conftest import client_for, settings
from tests.unit.conftest import _clean_environment, _no_network, _no_proxies, spans

APP_HOST = "chatqna.test"  # the app client's base URL (`client_for`)


def upstream_mock(**options: Any) -> respx.MockRouter:
    """A respx router for the upstreams: respx's `httpx` mocker, which routes every httpx
    client's requests whatever its transport (the upstream clients send through httpx);
    the app client's own requests to `APP_HOST` pass through to the app."""
    router = respx.mock(using="httpx", **options)
    router.route(host=APP_HOST).pass_through()
    return router


__all__ = [
    "_clean_environment",
    "_no_network",
    "_no_proxies",
    "client_for",
    "settings",
    "spans",
    "upstream_mock",
]
