"""The app's heap trimmer: after requests it hands freed pages back and counts it in
`/metrics`; `CHATQNA_HEAP_TRIM_SECONDS=0` turns it off."""

from __future__ import annotations

import asyncio
import itertools
import platform
import re
from pathlib import Path

import httpx
import pytest

from chatqna import heap
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory

pytestmark = pytest.mark.anyio

GLIBC = platform.libc_ver()[0] == "glibc"
PAGE = 4096


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} missing from /metrics"
    return float(match.group(1))


async def trims_after_a_chat(client: httpx.AsyncClient, wait_seconds: float) -> float:
    """The trims counted within `wait_seconds` of a chat (polling `/metrics`)."""
    response = await client.post("/v1/chatqna", json={"messages": "How do I export?"})
    assert response.status_code == 200
    deadline = asyncio.get_running_loop().time() + wait_seconds
    while True:
        await asyncio.sleep(0.05)
        trims = metric((await client.get("/metrics")).text, "chatqna_heap_trims_total")
        if trims or asyncio.get_running_loop().time() >= deadline:
            return trims


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
async def test_a_finished_request_leads_to_a_trim(
    client_for: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each trim reads the resident size before and after: make every trim free two pages.
    sizes = itertools.cycle([10 * PAGE, 8 * PAGE])
    monkeypatch.setattr(heap, "resident_bytes", lambda: next(sizes))
    settings = Settings(chatqna_data_dir=tmp_path / "data", chatqna_heap_trim_seconds=0.05)
    client = await client_for(settings_=settings)
    # The trimmer polls every 0.05 s; a collection and trim of a big test process take a while.
    assert await trims_after_a_chat(client, wait_seconds=30) >= 1
    text = (await client.get("/metrics")).text
    trims = metric(text, "chatqna_heap_trims_total")
    assert metric(text, "chatqna_heap_released_bytes_total") == trims * 2 * PAGE
    assert metric(text, "chatqna_requests_in_flight") == 1.0  # this very request


async def test_zero_turns_the_trimmer_off(client_for: ClientFactory, tmp_path: Path) -> None:
    settings = Settings(chatqna_data_dir=tmp_path / "data", chatqna_heap_trim_seconds=0)
    client = await client_for(settings_=settings)
    assert await trims_after_a_chat(client, wait_seconds=0.5) == 0  # ten trimmer polls' worth
