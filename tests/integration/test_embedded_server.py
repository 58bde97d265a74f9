"""The real server process on the embedded default: streaming, OpenAI clients, restarts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx2
import openai
import pytest

from chatqna.retrieval.embedded.chunk_store import STORE_FILE
from tests.integration.conftest import (
    SAMPLE_CORPUS,
    ServerProcess,
    ingest_cli,
    start_server,
)
from tests.unit.api.conftest import parse_sse

pytestmark = pytest.mark.slow

EXPORT_CHAT = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings > Workspace > Export and pick a format."},
    {"role": "user", "content": "What export formats are there?"},
]


def test_streams_a_two_turn_chat(sample_server: ServerProcess) -> None:
    response = httpx2.post(
        f"{sample_server.url}/v1/chatqna",
        json={"messages": EXPORT_CHAT, "max_tokens": 24},
        timeout=120,
    )
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert events[0][0] == "metadata"
    metadata = json.loads(events[0][1])
    sources = metadata["source_documents"]
    assert sources, "the metadata event must carry source documents"
    assert sources[0]["source"] == "export.md"
    assert all(doc["text"] and doc["source"].endswith(".md") for doc in sources)
    tokens = [
        json.loads(data)["choices"][0]["delta"].get("content") or ""
        for name, data in events[1:-1]
        if name == "message"
    ]
    assert "".join(tokens).strip(), "the answer must stream tokens"
    assert events[-1] == ("message", "[DONE]")


def test_openai_package_non_stream_and_stream(sample_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{sample_server.url}/v1", api_key="unused", timeout=120)
    completion = client.chat.completions.create(
        model="chatqna",
        messages=EXPORT_CHAT,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content
    assert completion.choices[0].message.role == "assistant"

    stream = client.chat.completions.create(
        model="chatqna",
        messages=EXPORT_CHAT,
        max_tokens=16,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}


def stored_generation(data: Path) -> int:
    """The embedded index's write counter, read from its store directly."""
    with sqlite3.connect(data / "index" / STORE_FILE) as db:
        return int(db.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])


def test_restart_reopens_the_index_without_re_embedding(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_server(data, tmp_path / "first.log")
    try:
        upload = [
            ("files", (p.name, p.read_bytes(), "text/markdown"))
            for p in sorted(SAMPLE_CORPUS.glob("*.md"))
        ]
        ingested = httpx2.post(f"{first.url}/v1/dataprep/ingest", files=upload, timeout=120)
        assert ingested.status_code == 200, ingested.text
        chunks = sum(f["chunks"] for f in ingested.json()["files"])
        embedded = httpx2.get(f"{first.url}/v1/ready").json()["backends"]["embedder"]
        assert embedded["texts_embedded"] >= chunks > 0
    finally:
        first.stop()
    generation = stored_generation(data)
    assert generation > 0

    second = start_server(data, tmp_path / "second.log")
    try:
        ready = httpx2.get(f"{second.url}/v1/ready").json()["backends"]
        assert ready["retriever"]["loaded_from_disk"] is True
        assert ready["retriever"]["chunks"] == chunks
        assert ready["embedder"]["texts_embedded"] == 0, "a restart must not re-embed"
        answer = httpx2.post(
            f"{second.url}/v1/chatqna",
            json={"messages": "When do promo credits expire?", "stream": False, "max_tokens": 8},
            timeout=120,
        )
        assert answer.json()["metadata"]["source_documents"][0]["source"] == "promo-credits.md"
        after = httpx2.get(f"{second.url}/v1/ready").json()["backends"]["embedder"]
        # Only the question, once, for the dense leg (the embedded default does not rerank).
        assert after["texts_embedded"] == 1
    finally:
        second.stop()
    assert stored_generation(data) == generation, "a restart and a search write nothing"


def test_cli_ingest_skips_unchanged_files(tmp_path: Path) -> None:
    first = ingest_cli(tmp_path / "data", SAMPLE_CORPUS)
    assert "10 file(s) ingested" in first.stdout
    second = ingest_cli(tmp_path / "data", SAMPLE_CORPUS)
    assert "0 file(s) ingested" in second.stdout and "10 unchanged" in second.stdout
