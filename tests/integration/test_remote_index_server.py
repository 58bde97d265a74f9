"""The megaservice end to end on Redis Stack (`REDIS_URL`) and through the retriever service
(`RETRIEVER_ENDPOINT`), as real server processes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from tests.integration.conftest import SAMPLE_CORPUS, start_server
from tests.integration.redis_server import redis_stack_server
from tests.unit.api.conftest import parse_sse

pytestmark = pytest.mark.slow

CHAT = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings > Workspace > Export."},
    # Not alike enough to the first question to be searched on its own: the turn is blended.
    {"role": "user", "content": "Which formats does it offer?"},
]


def _upload(url: str) -> None:
    files = [
        ("files", (p.name, p.read_bytes(), "text/markdown"))
        for p in sorted(SAMPLE_CORPUS.glob("*.md"))
    ]
    response = httpx2.post(f"{url}/v1/dataprep/ingest", files=files, timeout=120)
    assert response.status_code == 200, response.text


def _ask(url: str) -> dict[str, object]:
    response = httpx2.post(
        f"{url}/v1/chatqna", json={"messages": CHAT, "max_tokens": 8}, timeout=120
    )
    assert response.status_code == 200, response.text
    events = parse_sse(response.text)
    assert events[-1] == ("message", "[DONE]")
    metadata: dict[str, object] = json.loads(events[0][1])
    return metadata


def test_megaservice_on_redis_stack(tmp_path: Path) -> None:
    with redis_stack_server(tmp_path / "redis") as redis:
        server = start_server(
            tmp_path / "data",
            tmp_path / "mega.log",
            REDIS_URL=redis.url,
            INDEX_NAME="chatqna-e2e",
            REDIS_VECTOR_ALGORITHM="FLAT",
        )
        try:
            _upload(server.url)
            ready = httpx2.get(f"{server.url}/v1/ready").json()["backends"]["retriever"]
            assert ready["kind"] == "redis" and ready["chunks"] == 36
            sources = _ask(server.url)["source_documents"]
            assert isinstance(sources, list) and sources[0]["source"] == "export.md"
            listed = httpx2.post(f"{server.url}/v1/dataprep/get").json()
            assert len(listed) == 10
        finally:
            server.stop()
    assert not (tmp_path / "data" / "index").exists(), "nothing is written to the data dir"


def test_megaservice_through_the_retriever_service(tmp_path: Path) -> None:
    retriever = start_server(
        tmp_path / "retriever-data", tmp_path / "retriever.log", command="retriever"
    )
    try:
        _upload(retriever.url)
        mega = start_server(
            tmp_path / "mega-data",
            tmp_path / "mega.log",
            RETRIEVER_ENDPOINT=retriever.url,
            MULTI_TURN_BLEND_ENABLED="true",
        )
        try:
            metadata = _ask(mega.url)
            sources = metadata["source_documents"]
            assert isinstance(sources, list) and sources[0]["source"] == "export.md"
            retrieval = metadata["retrieval"]
            assert isinstance(retrieval, dict) and retrieval["blend"]["executed"] is True
            refused = httpx2.post(
                f"{mega.url}/v1/dataprep/ingest",
                files=[("files", ("x.md", b"# x\n\ntext", "text/plain"))],
            )
            assert refused.status_code == 501 and refused.json()["error"] == "not_supported"
            assert len(httpx2.post(f"{mega.url}/v1/dataprep/get").json()) == 10
        finally:
            mega.stop()
    finally:
        log = retriever.stop()
    # The megaservice sent its (blended) embedding: the retriever service embedded nothing
    # for the chat turn (only the ingested chunks).
    assert "POST /v1/retrieval" in log
