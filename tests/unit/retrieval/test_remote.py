"""The retriever service's client: the wire format, its errors, and no writes."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import respx

from chatqna.backends.protocols import SearchQuery, SourceBatch
from chatqna.errors import BadUpstreamResponse, NotSupported, UpstreamError
from chatqna.retrieval.remote import RemoteRetriever

pytestmark = pytest.mark.anyio


def _answer(docs: list[dict[str, object]]) -> httpx.Response:
    return httpx.Response(200, json={"id": "x", "retrieved_docs": docs, "initial_query": "q"})


async def test_remote_retriever_wire_format() -> None:
    remote = RemoteRetriever("http://retriever.test")
    vector = np.array([0.6, 0.8], dtype=np.float32)
    with respx.mock(using="httpx") as router:
        route = router.post("http://retriever.test/v1/retrieval").mock(
            return_value=_answer(
                [
                    {
                        "id": "c1",
                        "text": "Refunds take 5 days.",
                        "score": 0.03,
                        "metadata": {
                            "source": "refunds.md",
                            "title": "Refunds",
                            "chunk_index": 2,
                            "scores": {"dense": 0.8, "bm25": 1.5, "fusion": 0.03},
                        },
                    }
                ]
            )
        )
        hits = await remote.search(SearchQuery("refund?", vector, 3, hybrid=False))
    sent = json.loads(route.calls[0].request.content)
    assert sent["text"] == "refund?" and sent["k"] == 3 and sent["hybrid"] is False
    assert sent["embedding"] == pytest.approx([0.6, 0.8])
    (hit,) = hits
    assert (hit.chunk.id, hit.chunk.source, hit.chunk.index) == ("c1", "refunds.md", 2)
    assert hit.scores == {"dense": 0.8, "bm25": 1.5, "fusion": 0.03} and hit.score == 0.03


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(500), UpstreamError),
        (httpx.Response(200, json={"docs": []}), BadUpstreamResponse),
        (httpx.Response(200, json={"retrieved_docs": [{"id": "x"}]}), BadUpstreamResponse),
        (httpx.Response(200, text="nope"), BadUpstreamResponse),
    ],
)
async def test_remote_retriever_errors(response: httpx.Response, error: type) -> None:
    remote = RemoteRetriever("http://retriever.test")
    with respx.mock(using="httpx") as router:
        router.post("http://retriever.test/v1/retrieval").mock(return_value=response)
        with pytest.raises(error):
            await remote.search(SearchQuery("q", np.ones(2, dtype=np.float32), 1))


async def test_remote_retriever_cannot_ingest() -> None:
    remote = RemoteRetriever("http://retriever.test")
    with pytest.raises(NotSupported):
        await remote.replace_sources([SourceBatch("a.md", [], np.zeros((0, 2)))])
