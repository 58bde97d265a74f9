"""Which clients of our own service read proxies from the environment (`upstream/proxies.py`):
none whose service is on loopback."""

from __future__ import annotations

import pytest

from chatqna.upstream.proxies import is_loopback, trust_env_for


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.255.0.9", True),  # all of 127.0.0.0/8
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LocalHost.", True),
        ("128.0.0.1", False),
        ("10.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("localhost.example.com", False),
        ("chatqna", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("url", "trust_env"),
    [
        ("http://127.0.0.1:8888", False),
        ("http://localhost:8888/", False),
        ("http://[::1]:8888", False),
        ("https://user:pw@127.0.0.2/chat", False),
        ("http://chatqna.internal:8888", True),
        ("http://192.168.1.5:8888", True),
        ("http://[::1", True),  # not a URL: the request says so, not this
    ],
)
def test_only_a_service_on_loopback_ignores_the_environment(url: str, trust_env: bool) -> None:
    assert trust_env_for(url) is trust_env
