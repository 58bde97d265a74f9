"""The live backends: closed once each (a shared LLM too), readiness per role.

Every remote role's readiness probe is bounded as a whole by its role's timeout. Against
an upstream that answers its status line at once and then trickles the body a byte at a
time forever, no single read ever waits long, so only a bound on the whole probe ends it.
The probe then fails as an `UpstreamTimeout`, and the abandoned body is closed, so a
pooled connection is not kept by a probe nobody waits for any more.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest

from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.tei import TEIEmbedder, TEIReranker
from chatqna.errors import UpstreamTimeout
from chatqna.retrieval.remote import RemoteRetriever
from chatqna.upstream.policy import RetryPolicy

pytestmark = pytest.mark.anyio


class Closing(ScriptedLLM):
    closed = 0

    async def aclose(self) -> None:
        Closing.closed += 1


class Retriever:
    supports_bm25_history = True

    async def describe(self) -> dict[str, Any]:
        raise RuntimeError("index unavailable")

    async def aclose(self) -> None:
        raise RuntimeError("closing fails: the others still close")


async def test_close_once_each_and_report_readiness() -> None:
    llm = Closing()
    backends = Backends(HashingEmbedder(), Retriever(), None, llm, llm)  # type: ignore[arg-type]
    ready = await backends.describe()
    assert ready["retriever"] == {"ready": False, "error": "index unavailable"}
    assert ready["reranker"] == {"ready": True, "kind": "disabled"}
    assert "condense_llm" not in ready, "the chat LLM also condenses"
    await backends.aclose()
    assert Closing.closed == 1


async def test_the_rewrite_server_is_closed_and_reported_once() -> None:
    """The embedded LLM's second server is also the condense LLM: one role, one close."""
    closed: list[str] = []

    class Named(ScriptedLLM):
        async def aclose(self) -> None:
            closed.append(self.model)

    llm, rewrites = Named(model="llm"), Named(model="rewrite_llm")
    backends = Backends(
        HashingEmbedder(),
        Retriever(),  # type: ignore[arg-type]
        None,
        llm,
        rewrites,
        rewrite_llm=rewrites,
    )
    ready = await backends.describe()
    assert ready["rewrite_llm"]["ready"] and "condense_llm" not in ready
    await backends.aclose()
    assert closed == ["rewrite_llm", "llm"]


BASE = "http://upstream.test"
BOUND = 0.3
# Far beyond BOUND: a probe that is not bounded as a whole fails the test instead of hanging.
GIVE_UP = 5.0


@dataclass
class Trickle:
    """A transport whose every answer is `200`, then one byte per 10 ms, forever; it
    counts the bodies begun and the bodies closed."""

    opened: int = 0
    closed: int = 0
    paths: list[str] = field(default_factory=list)

    async def body(self) -> AsyncIterator[bytes]:
        self.opened += 1
        try:
            while True:
                yield b" "
                await asyncio.sleep(0.01)
        finally:
            self.closed += 1

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.paths.append(request.url.path)
        return httpx2.Response(200, content=self.body())

    @property
    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handler)


Backend = Any
BUILDERS: dict[str, Callable[[httpx2.AsyncBaseTransport], Backend]] = {
    "embedder": lambda t: TEIEmbedder(BASE, timeout_seconds=BOUND, transport=t),
    "reranker": lambda t: TEIReranker(BASE, timeout_seconds=BOUND, transport=t),
    "retriever": lambda t: RemoteRetriever(BASE, timeout_seconds=BOUND, transport=t),
    "llm": lambda t: OpenAIChatLLM(BASE, "m", timeout_seconds=BOUND, transport=t),
}


async def timed(probe: Awaitable[Any]) -> float:
    """Seconds `probe` took to fail with `UpstreamTimeout`."""
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(GIVE_UP):
        with pytest.raises(UpstreamTimeout) as info:
            await probe
    assert info.value.status_code == 504
    return asyncio.get_running_loop().time() - started


@pytest.mark.parametrize("role", list(BUILDERS))
async def test_a_trickling_probe_times_out_and_releases_its_body(role: str) -> None:
    upstream = Trickle()
    backend = BUILDERS[role](upstream.transport)
    try:
        elapsed = await timed(backend.describe())
    finally:
        await backend.aclose()
    assert BOUND <= elapsed < BOUND + 1.0
    assert upstream.opened == upstream.closed == 1


async def test_the_embedder_probe_is_not_retried_past_its_bound() -> None:
    upstream = Trickle()
    embedder = TEIEmbedder(
        BASE,
        timeout_seconds=BOUND,
        retry=RetryPolicy(attempts=5, backoff_seconds=0.0),
        transport=upstream.transport,
    )
    try:
        elapsed = await timed(embedder.describe())
    finally:
        await embedder.aclose()
    assert elapsed < 2 * BOUND
    assert upstream.paths == ["/v1/embeddings"]


async def test_readiness_reports_timed_out_probes_as_unready_with_their_reason() -> None:
    upstream = Trickle()
    retriever = RemoteRetriever(BASE, timeout_seconds=BOUND, transport=upstream.transport)
    llm = OpenAIChatLLM(BASE, "m", timeout_seconds=BOUND, transport=upstream.transport)
    backends = Backends(HashingEmbedder(), retriever, None, llm, llm)
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(GIVE_UP):
            ready = await backends.describe()
    finally:
        await backends.aclose()
    assert asyncio.get_running_loop().time() - started < BOUND + 1.0, "probes run side by side"
    assert ready["llm"] == {"ready": False, "error": "llm: GET /v1/models timed out"}
    assert ready["retriever"] == {"ready": False, "error": "retriever: GET /v1/ready timed out"}
    assert ready["embedder"]["ready"] is True
    assert upstream.opened == upstream.closed == 2


async def test_concurrent_readiness_checks_share_each_roles_probe_and_its_bound() -> None:
    upstream = Trickle()
    retriever = RemoteRetriever(BASE, timeout_seconds=BOUND, transport=upstream.transport)
    llm = OpenAIChatLLM(BASE, "m", timeout_seconds=BOUND, transport=upstream.transport)
    backends = Backends(HashingEmbedder(), retriever, None, llm, llm)
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(GIVE_UP):
            checks = await asyncio.gather(*(backends.describe() for _ in range(8)))
    finally:
        await backends.aclose()
    assert asyncio.get_running_loop().time() - started < BOUND + 1.0
    assert sorted(upstream.paths) == ["/v1/models", "/v1/ready"]  # one probe each, not eight
    assert all(check == checks[0] for check in checks)
    assert checks[0]["retriever"] == {"ready": False, "error": "retriever: GET /v1/ready timed out"}


class Gated:
    """A backend whose probe counts itself and answers once `release` is set."""

    supports_bm25_history = True

    def __init__(self) -> None:
        self.probes = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def describe(self) -> dict[str, Any]:
        self.probes += 1
        self.started.set()
        await self.release.wait()
        return {"kind": "gated", "probe": self.probes}

    async def aclose(self) -> None:
        return None


async def test_a_check_that_goes_away_leaves_the_shared_probe_to_the_others() -> None:
    retriever = Gated()
    backends = Backends(HashingEmbedder(), retriever, None, ScriptedLLM(), ScriptedLLM())  # type: ignore[arg-type]
    first = asyncio.create_task(backends.describe())
    await asyncio.wait_for(retriever.started.wait(), GIVE_UP)
    second = asyncio.create_task(backends.describe())
    await asyncio.sleep(0.05)  # the second check waits for the first one's probe
    first.cancel()  # its client went away
    retriever.release.set()
    ready = await asyncio.wait_for(second, GIVE_UP)
    assert ready["retriever"] == {"ready": True, "kind": "gated", "probe": 1}
    assert retriever.probes == 1
    # Nothing is kept: the next check probes again.
    assert (await backends.describe())["retriever"]["probe"] == 2
    await backends.aclose()
