"""An app on fake backends (hashing embedder, embedded index, scripted LLM), in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest

from chatqna.app import create_app
from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import HashingEmbedder, RecordingReranker, ScriptedLLM
from chatqna.backends.protocols import ChatLLM, Embedder, Reranker
from chatqna.composition import build_translator
from chatqna.ingest.dataprep import IngestFile, ingest_files
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.settings import Settings
from tests.sse_events import parse_events
from tests.unit.conftest import TRACER_PROVIDER

HANDBOOK = {
    "export.md": "# Export\n\n## How to export\nOpen Settings and choose Export to download "
    "your workspace data as a Markdown zip.\n\n## Export after cancelling\nExport stays "
    "available in read-only mode after you cancel.\n",
    "retention.md": "# Retention\n\n## Retention after cancellation\nData is kept for 30 days "
    "after cancellation, then permanently deleted.\n",
    "refunds.md": "# Refunds\n\n## Annual refunds\nAnnual plans can be refunded in full within "
    "30 days of purchase; refunds take 5 to 10 business days.\n",
}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(chatqna_data_dir=tmp_path / "data")


async def make_backends(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    reranker: Reranker | None = None,
    llm: ChatLLM | None = None,
    corpus: dict[str, str] | None = None,
) -> Backends:
    embedder = embedder if embedder is not None else HashingEmbedder()
    index = await EmbeddedHybridIndex.open(
        settings.index_dir, embedder_name="hashing-64", dimension=64
    )
    files = [IngestFile(name, text.encode()) for name, text in (corpus or HANDBOOK).items()]
    await ingest_files(files, HashingEmbedder(), index)
    chat = llm if llm is not None else ScriptedLLM()
    return Backends(
        embedder=embedder,
        retriever=index,
        reranker=reranker if reranker is not None else RecordingReranker(),
        llm=chat,
        condense_llm=chat,
        translator=build_translator(settings, chat),
    )


ClientFactory = Callable[..., Any]


@pytest.fixture
async def client_for(settings: Settings) -> AsyncIterator[ClientFactory]:
    """`await client_for(backends=None, settings=None, role="megaservice")` -> an httpx2
    client on a running app."""
    stack: list[Any] = []

    async def factory(
        backends: Backends | None = None,
        settings_: Settings | None = None,
        role: Literal["megaservice", "retriever"] = "megaservice",
    ) -> httpx2.AsyncClient:
        chosen = settings_ if settings_ is not None else settings
        live = backends if backends is not None else await make_backends(chosen)
        app = create_app(chosen, live, tracer_provider=TRACER_PROVIDER, role=role)
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        client = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://localhost:8888"
        )
        stack.append((lifespan, client))
        return client

    yield factory
    for lifespan, client in reversed(stack):
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


def parse_sse(text: str) -> list[tuple[str, str]]:
    """Split an SSE body into `(event, data)` pairs; the default event is `message`."""
    return [(item.event, item.data) for item in parse_events(text)]
