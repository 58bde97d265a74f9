"""Reading the proxy and the credentials of one upstream; the sessions themselves run on real
sockets in `tests/contract/test_upstream_client.py`."""

from __future__ import annotations

import pytest

from chatqna.upstream.sessions import basic_auth, env_proxy

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def test_no_proxy_variables_means_direct() -> None:
    assert env_proxy("http://tei:80") is None


def test_the_proxy_for_the_upstreams_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://plain-proxy:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://tls-proxy:3128")
    assert env_proxy("http://tei:80") == "http://plain-proxy:3128"
    assert env_proxy("https://llm.example/v1") == "http://tls-proxy:3128"


def test_all_proxy_covers_a_scheme_without_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALL_PROXY", "http://egress:3128")
    assert env_proxy("https://llm.example/v1") == "http://egress:3128"


@pytest.mark.parametrize(
    ("no_proxy", "url", "proxied"),
    [
        ("tei,redis", "http://tei:80", False),
        (".svc.cluster.local", "http://tei.ns.svc.cluster.local:80", False),
        ("*", "https://llm.example", False),
        ("tei", "https://llm.example", True),
    ],
)
def test_no_proxy_exempts_its_hosts(
    monkeypatch: pytest.MonkeyPatch, no_proxy: str, url: str, proxied: bool
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://egress:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://egress:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert (env_proxy(url) is not None) is proxied


def test_credentials_come_decoded_from_the_url() -> None:
    assert basic_auth("https://us%40er:p%3Ass@llm.example/v1") == ("us@er", "p:ss")
    assert basic_auth("https://llm.example/v1") is None
