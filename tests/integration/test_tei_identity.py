"""An index built through one TEI URL opens through another URL of the same model: ingest
from the host through a published port, serve through the compose name. Two loopback
stand-ins stand for the two URLs; a third serves another model, whose index is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.bundle import Backends
from chatqna.backends.protocols import SearchQuery
from chatqna.composition import build_retrieval_backends
from chatqna.errors import StartupFailed
from chatqna.ingest.dataprep import IngestFile, ingest_files
from chatqna.settings import Settings
from tests.standins.servers import create_standin_app, serve_in_thread

pytestmark = pytest.mark.anyio

REFUNDS = "# Refunds\n\nAnnual plans can be refunded in full within 30 days of the purchase."


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    """Two stand-ins serving one model, and one serving another, on loopback."""
    with (
        serve_in_thread(create_standin_app()) as host_port,
        serve_in_thread(create_standin_app()) as service_name,
        serve_in_thread(create_standin_app(model_id="standin/another-model")) as other,
    ):
        yield {"host_port": host_port, "service_name": service_name, "other": other}


async def open_index(tmp_path: Path, url: str) -> Backends:
    settings = Settings(_env_file=None, tei_embedding_endpoint=url, chatqna_data_dir=tmp_path)
    return await build_retrieval_backends(settings)


async def test_an_index_ingested_through_one_url_serves_through_another(
    tmp_path: Path, urls: dict[str, str]
) -> None:
    ingesting = await open_index(tmp_path, urls["host_port"])
    try:
        assert ingesting.embedder.name == "tei:standin/feature-hashing"
        await ingest_files(
            [IngestFile("refunds.md", REFUNDS.encode())], ingesting.embedder, ingesting.retriever
        )
    finally:
        await ingesting.aclose()

    serving = await open_index(tmp_path, urls["service_name"])
    try:
        assert serving.embedder.name == "tei:standin/feature-hashing"
        question = "can annual plans be refunded"
        vector = (await serving.embedder.embed([question]))[0]
        found = await serving.retriever.search(SearchQuery(text=question, embedding=vector, k=1))
        assert [hit.chunk.source for hit in found] == ["refunds.md"]
        assert np.isfinite(found[0].score)
        readiness = await serving.describe()
        assert readiness["embedder"]["model"] == "standin/feature-hashing"
        assert readiness["embedder"]["endpoint"] == urls["service_name"]
    finally:
        await serving.aclose()


async def test_another_model_behind_a_url_is_refused(tmp_path: Path, urls: dict[str, str]) -> None:
    await (await open_index(tmp_path, urls["host_port"])).aclose()
    with pytest.raises(StartupFailed, match="standin/another-model") as refused:
        await open_index(tmp_path, urls["other"])
    assert "tei:standin/feature-hashing" in str(refused.value)
