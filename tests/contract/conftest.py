"""Contract suites: one list of cases, run over every implementation of a backend Protocol.

Remote implementations talk to an `httpx2.MockTransport` that speaks the upstream's
documented wire format (`tests/contract/wire.py`); embedded ones run for real, and those
that load a model carry the `slow` mark. Connections may go to loopback only: the embedded
LLM is llama.cpp's server on 127.0.0.1, and nothing here may reach further.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

import pytest


class NetworkBlocked(RuntimeError):
    """Raised when a contract test tries to reach beyond loopback."""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module-wide, so a backend (a loaded model) is built once per module."""
    return "asyncio"


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0] if isinstance(address, tuple) else address
            if not ipaddress.ip_address(str(host)).is_loopback:
                raise NetworkBlocked(f"contract tests stay on loopback ({address!r})")
        real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield
