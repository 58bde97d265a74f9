"""Shared by the remote-client tests: a respx router on the module's `BASE` URL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import respx

from chatqna.errors import UpstreamFailure


def shape(exc: UpstreamFailure) -> tuple[int, str, str]:
    """What a client sees of an upstream failure: HTTP status, error code, backend role."""
    return exc.status_code, exc.code, exc.backend


@pytest.fixture
def router(request: pytest.FixtureRequest) -> Iterator[respx.MockRouter]:
    """Mocks the test module's `BASE`; routes a test does not call are allowed. respx's
    `httpx` mocker: it routes every httpx client's requests, whatever its transport."""
    mock = respx.mock(using="httpcore2", base_url=request.module.BASE, assert_all_called=False)
    with mock:
        yield mock
