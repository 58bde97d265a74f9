"""Feature suites: the whole app driven through `httpx.ASGITransport` on in-process backends.

They reuse the unit tests' fixtures (the app client, settings, the in-memory span exporter)
and their guards: no network, and no ChatQnA variable leaking in from the environment.
"""

from tests.unit.api.conftest import client_for, settings
from tests.unit.conftest import _clean_environment, _no_network, spans

__all__ = [
    "_clean_environment",
    "_no_network",
    "client_for",
    "settings",
    "spans",
]
