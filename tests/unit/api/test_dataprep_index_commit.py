"""Dataprep over the embedded index: a write whose BM25 commit fails after the store
committed is answered as done, and the next listing and search show it."""

from __future__ import annotations

import pytest

from chatqna.retrieval.embedded import lexical
from tests.unit.api.conftest import ClientFactory

pytestmark = pytest.mark.anyio


async def test_a_bm25_commit_failing_after_the_store_committed_answers_success(
    client_for: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await client_for()
    write = lexical.LexicalIndex.write

    def disk_full(self: lexical.LexicalIndex, *args: object, **kwargs: object) -> None:
        monkeypatch.setattr(lexical.LexicalIndex, "write", write)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lexical.LexicalIndex, "write", disk_full)
    text = b"# Refunds\n\n## Zebras\nZebra sticker orders are refunded within a day.\n"
    response = await client.post(
        "/v1/dataprep/ingest", files=[("files", ("refunds.md", text, "text/markdown"))]
    )
    assert response.status_code == 200, response.text
    assert response.json()["files"] == [{"name": "refunds.md", "status": "ingested", "chunks": 1}]
    listing = {i["name"]: i["chunks"] for i in (await client.post("/v1/dataprep/get")).json()}
    assert listing["refunds.md"] == 1
    answer = await client.post(
        "/v1/chatqna", json={"messages": "zebra sticker refunds", "stream": False}
    )
    assert answer.status_code == 200, answer.text
    found = answer.json()["metadata"]["source_documents"]
    top = [d for d in found if d["source"] == "refunds.md"]
    assert [d["text"] for d in top] == ["Zebra sticker orders are refunded within a day."]
    assert top[0]["scores"]["bm25"] > 0  # the BM25 index was rebuilt from the store
