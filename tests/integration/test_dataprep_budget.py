"""What one ingest request may expand to, through a real `chatqna serve`.

The server embeds through a stand-in TEI (`tests.standins.servers`, in a thread on
loopback) and writes its own embedded index. Many small files that each pass the per-file
bounds, but not the request's together, are refused with the 413 envelope before anything
is embedded, and the index lists exactly what it listed before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.integration.conftest import ServerProcess, start_server
from tests.standins.servers import create_standin_app, serve_in_thread

pytestmark = pytest.mark.slow

MAX_CHUNKS = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("budget")
    with serve_in_thread(create_standin_app()) as standin:
        process = start_server(
            root / "data",
            root / "server.log",
            TEI_EMBEDDING_ENDPOINT=standin,
            TEI_RERANKING_ENDPOINT=standin,
            LLM_ENDPOINT=standin,
            LLM_MODEL_ID="standin",
            CHATQNA_DATAPREP_MAX_REQUEST_CHUNKS=str(MAX_CHUNKS),
            CHATQNA_DATAPREP_MAX_REQUEST_TEXT_CHARS="2000",
            OTEL_TRACES_EXPORTER="none",
        )
        try:
            yield process
        finally:
            process.stop()


def listed(server: ServerProcess) -> list[tuple[str, int]]:
    answer = httpx2.post(f"{server.url}/v1/dataprep/get", timeout=10)
    assert answer.status_code == 200, answer.text
    return sorted((item["name"], item["chunks"]) for item in answer.json())


def notes(
    count: int, size: int = 60, name: str = "note"
) -> list[tuple[str, tuple[str, bytes, str]]]:
    body = (b"Tomato seedlings need water every morning. " * (size // 44 + 1))[:size]
    return [("files", (f"{name}-{i}.txt", body, "text/plain")) for i in range(count)]


def ingest(
    server: ServerProcess, files: list[tuple[str, tuple[str, bytes, str]]]
) -> httpx2.Response:
    return httpx2.post(f"{server.url}/v1/dataprep/ingest", files=files, timeout=30)


@pytest.mark.parametrize(
    ("files", "variable"),
    [
        (notes(MAX_CHUNKS + 1, name="more"), "CHATQNA_DATAPREP_MAX_REQUEST_CHUNKS"),
        (notes(3, size=900, name="long"), "CHATQNA_DATAPREP_MAX_REQUEST_TEXT_CHARS"),
    ],
)
def test_a_request_beyond_its_budget_is_413_and_the_index_is_unchanged(
    server: ServerProcess, files: list[tuple[str, tuple[str, bytes, str]]], variable: str
) -> None:
    first = ingest(server, notes(2))
    assert first.status_code == 200, first.text
    before = listed(server)
    assert before == [("note-0.txt", 1), ("note-1.txt", 1)]

    refused = ingest(server, files)
    assert refused.status_code == 413, refused.text
    body = refused.json()
    assert (body["error"], body["reason"]) == ("payload_too_large", "request_too_large")
    assert variable in body["message"]
    assert listed(server) == before
