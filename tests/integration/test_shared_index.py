"""Two service processes on one data directory: what one ingests or deletes, the other
finds (or no longer finds) on its next search; both may write, one at a time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

from tests.integration.conftest import SAMPLE_CORPUS, start_server

pytestmark = pytest.mark.slow


def upload(url: str, files: list[tuple[str, bytes]]) -> None:
    parts = [("files", (name, data, "text/markdown")) for name, data in files]
    response = httpx2.post(f"{url}/v1/dataprep/ingest", files=parts, timeout=180)
    assert response.status_code == 200, response.text


def sources_found(url: str, text: str, k: int = 5) -> list[str]:
    response = httpx2.post(f"{url}/v1/retrieval", json={"text": text, "k": k}, timeout=60)
    assert response.status_code == 200, response.text
    return [doc["metadata"]["source"] for doc in response.json()["retrieved_docs"]]


def listed(url: str) -> set[str]:
    response = httpx2.post(f"{url}/v1/dataprep/get", timeout=30)
    assert response.status_code == 200, response.text
    return {entry["name"] for entry in response.json()}


def test_two_processes_share_one_index(tmp_path: Path) -> None:
    data = tmp_path / "data"
    servers = [
        start_server(data, tmp_path / f"{name}.log", command="retriever") for name in ("a", "b")
    ]
    first, second = servers
    try:
        corpus = [(p.name, p.read_bytes()) for p in sorted(SAMPLE_CORPUS.glob("*.md"))]
        upload(first.url, corpus)
        # The other process searches what the first ingested, with no restart or wait.
        assert sources_found(second.url, "How do I export my workspace data as CSV?")[0] == (
            "export.md"
        )
        assert listed(second.url) == {name for name, _ in corpus}

        note = b"# Zanzibar\n\nThe zanzibar office opens at nine and serves mango tea.\n"
        upload(second.url, [("zanzibar.md", note)])
        assert sources_found(first.url, "zanzibar office mango tea")[0] == "zanzibar.md"

        response = httpx2.post(
            f"{first.url}/v1/dataprep/delete", json={"file_path": "zanzibar.md"}, timeout=30
        )
        assert response.status_code == 200, response.text
        assert "zanzibar.md" not in sources_found(second.url, "zanzibar office mango tea", 20)

        # Both write at once: the writer lock serialises them; both land, nothing is torn.
        notes = {
            server.url: [(f"{name}-0.md", f"# {name}\n\nThe {name} topic.\n".encode())]
            for server, name in ((first, "quokka"), (second, "axolotl"))
        }
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda url: upload(url, notes[url]), notes))
        expected = {name for name, _ in corpus} | {"quokka-0.md", "axolotl-0.md"}
        for server in servers:
            assert listed(server.url) == expected
            assert sources_found(server.url, "quokka topic")[0] == "quokka-0.md"
            assert sources_found(server.url, "axolotl topic")[0] == "axolotl-0.md"
            ready = httpx2.get(f"{server.url}/v1/ready", timeout=30).json()["backends"]
            assert ready["retriever"]["kind"] == "embedded"
        chunks = [
            httpx2.get(f"{s.url}/v1/ready", timeout=30).json()["backends"]["retriever"]["chunks"]
            for s in servers
        ]
        assert chunks[0] == chunks[1] > len(corpus)
    finally:
        logs = [server.stop() for server in servers]
    assert all("Traceback" not in log for log in logs), logs
