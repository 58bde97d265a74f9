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
    with respx.mock(using="httpcore2") as router:
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
    with respx.mock(using="httpcore2") as router:
        router.post("http://retriever.test/v1/retrieval").mock(return_value=response)
        with pytest.raises(error):
            await remote.search(SearchQuery("q", np.ones(2, dtype=np.float32), 1))


async def test_remote_retriever_cannot_ingest() -> None:
    remote = RemoteRetriever("http://retriever.test")
    with pytest.raises(NotSupported):
        await remote.replace_sources([SourceBatch("a.md", [], np.zeros((0, 2)))])


def _doc(**fields: object) -> dict[str, object]:
    """A retrieved doc as the retrieval API documents it, with `fields` replaced."""
    doc: dict[str, object] = {
        "id": "c1",
        "text": "Refunds take 5 days.",
        "score": 0.5,
        "metadata": {"source": "refunds.md", "title": "Refunds", "chunk_index": 2},
    }
    return {**doc, **fields}


def _meta(**fields: object) -> dict[str, object]:
    return _doc(metadata={"source": "refunds.md", "chunk_index": 2, **fields})


MALFORMED_DOCS = {
    "chunk_index-string": _meta(chunk_index="x"),
    "chunk_index-list": _meta(chunk_index=[1]),
    "chunk_index-float": _meta(chunk_index=1e30),
    "chunk_index-bool": _meta(chunk_index=True),
    "chunk_index-negative": _meta(chunk_index=-1),
    "source-number": _meta(source=7),
    "title-object": _meta(title={"t": 1}),
    "scores-list": _meta(scores=[0.5]),
    "scores-value-string": _meta(scores={"dense": "high"}),
    "metadata-list": _doc(metadata=["refunds.md"]),
    "id-object": _doc(id={"x": 1}),
    "score-string": _doc(score="0.5"),
    "score-bool": _doc(score=True),
    "doc-not-object": "Refunds take 5 days.",  # type: ignore[dict-item]
}


@pytest.mark.parametrize("doc", list(MALFORMED_DOCS.values()), ids=list(MALFORMED_DOCS))
async def test_a_malformed_field_is_a_bad_upstream_response(doc: object) -> None:
    remote = RemoteRetriever("http://retriever.test")
    with respx.mock(using="httpcore2") as router:
        router.post("http://retriever.test/v1/retrieval").mock(return_value=_answer([doc]))  # type: ignore[list-item]
        with pytest.raises(BadUpstreamResponse) as info:
            await remote.search(SearchQuery("q", np.ones(2, dtype=np.float32), 1))
    assert (info.value.status_code, info.value.backend) == (502, "retriever")


async def test_absent_and_null_optional_fields_take_their_defaults() -> None:
    remote = RemoteRetriever("http://retriever.test")
    docs = [
        {"text": "bare"},
        {"id": None, "text": "nulls", "score": None, "metadata": None},
        {"text": "null score", "metadata": {"chunk_index": None, "scores": {"dense": None}}},
    ]
    with respx.mock(using="httpcore2") as router:
        router.post("http://retriever.test/v1/retrieval").mock(return_value=_answer(docs))
        hits = await remote.search(SearchQuery("q", np.ones(2, dtype=np.float32), 3))
    assert [(h.chunk.id, h.chunk.source, h.chunk.index, h.score) for h in hits] == [
        ("", "", 0, 0.0),
        ("", "", 0, 0.0),
        ("", "", 0, 0.0),
    ]
    assert hits[2].scores == {}


async def test_listing_and_deleting_sources_read_the_documented_fields() -> None:
    remote = RemoteRetriever("http://retriever.test")
    with respx.mock(using="httpcore2") as router:
        router.post("http://retriever.test/v1/dataprep/get").respond(
            json=[{"name": "refunds.md", "chunks": 3}, {"name": "faq.md"}]
        )
        router.post("http://retriever.test/v1/dataprep/delete").respond(json={"removed_chunks": 3})
        listed = await remote.list_sources()
        removed = await remote.delete_sources(["refunds.md"])
    assert [(s.source, s.chunks) for s in listed] == [("refunds.md", 3), ("faq.md", 0)]
    assert removed == 3


@pytest.mark.parametrize(
    "files",
    [
        pytest.param(["refunds.md"], id="name-only"),
        pytest.param([["refunds.md", 3]], id="pair"),
        pytest.param([{"chunks": 3}], id="no-name"),
        pytest.param([{"name": 7, "chunks": 3}], id="name-number"),
        pytest.param([{"name": "refunds.md", "chunks": "3"}], id="chunks-string"),
        pytest.param([{"name": "refunds.md", "chunks": [3]}], id="chunks-list"),
    ],
)
async def test_a_malformed_file_list_is_a_bad_upstream_response(files: list[object]) -> None:
    remote = RemoteRetriever("http://retriever.test")
    with respx.mock(using="httpcore2") as router:
        router.post("http://retriever.test/v1/dataprep/get").respond(json=files)
        with pytest.raises(BadUpstreamResponse):
            await remote.list_sources()


@pytest.mark.parametrize(
    "body",
    [{"removed_chunks": "x"}, {"removed_chunks": [1]}, {"removed_chunks": -1}, ["removed"]],
)
async def test_a_malformed_deletion_reply_is_a_bad_upstream_response(body: object) -> None:
    remote = RemoteRetriever("http://retriever.test")
    with respx.mock(using="httpcore2") as router:
        router.post("http://retriever.test/v1/dataprep/delete").respond(json=body)
        with pytest.raises(BadUpstreamResponse):
            await remote.delete_sources(["refunds.md"])
