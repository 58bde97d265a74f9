"""The `Retriever` contract, over the embedded index, Redis Stack and a Redis Cluster of three
primaries and three replicas (slow: they start servers), and the retriever service
(`RemoteRetriever` against a retriever-role app, over ASGI), and the recording stand-in the
unit tests wrap a retriever in (here around the embedded index).

Every implementation is built the way the service builds it (`build_retriever` from
`Settings`), and driven only through the Protocol. The retriever service cannot be written
through its client (`replace_sources` is `NotSupported`: it ingests through its own
dataprep), so its cases write to the index behind the service and read through the client.
Vectors come from the hashing embedder: texts that share words are near.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from chatqna.app import create_app
from chatqna.backends.fakes import HashingEmbedder, RecordingRetriever
from chatqna.backends.no_llm import NoLLM
from chatqna.backends.protocols import Retriever, SearchQuery, SourceBatch
from chatqna.composition import Backends, build_retriever
from chatqna.documents import Chunk, ScoredChunk, chunk_id_for
from chatqna.errors import NotSupported
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.remote import RemoteRetriever
from chatqna.settings import Settings

pytestmark = pytest.mark.anyio

EMBEDDER = HashingEmbedder(64)
CORPUS = {
    "a.md": [
        "Refunds for annual plans take five to ten business days.",
        "Monthly plans are not refunded after the first week.",
    ],
    "b.md": [
        "Exports are Markdown files in a zip archive.",
        "Two-factor authentication uses an authenticator app.",
    ],
    "c.md": ["Invoices are emailed to the billing contact every month."],
}


@dataclass
class Subject:
    """The retriever under test, and the index its chunks are written to."""

    retriever: Retriever
    writer: Retriever
    name: str  # the fixture's parameter: embedded, service, redis, ...


async def batch(source: str, texts: list[str], title: str | None = None) -> SourceBatch:
    """The source's chunks, embedded as ingestion embeds them (title line, then text)."""
    heading = source if title is None else title
    chunks = [
        Chunk(id=chunk_id_for(source, i), text=text, source=source, title=heading, index=i)
        for i, text in enumerate(texts)
    ]
    vectors = await EMBEDDER.embed([chunk.indexed_text for chunk in chunks])
    return SourceBatch(source, chunks, vectors, content_hash=f"h-{source}")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.integration.redis_server import redis_stack_server

    with redis_stack_server(tmp_path_factory.mktemp("redis")) as running:
        yield running.url


async def retriever_service(settings: Settings) -> AsyncIterator[Subject]:
    index = await build_retriever(settings, EMBEDDER)
    none = NoLLM()
    app = create_app(settings, Backends(EMBEDDER, index, None, none, none), role="retriever")
    async with app.router.lifespan_context(app):
        client = RemoteRetriever("http://localhost:7000", transport=httpx2.ASGITransport(app=app))
        yield Subject(client, index, "service")
        await client.aclose()
    await index.aclose()


@pytest.fixture(scope="module")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.integration.redis_server import redis_cluster

    with redis_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running.url


@pytest.fixture(
    params=[
        "embedded",
        "embedded-graph",
        "service",
        "recording",
        pytest.param("redis", marks=pytest.mark.slow),
        pytest.param("cluster", marks=pytest.mark.slow),
    ]
)
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    settings = Settings(chatqna_data_dir=tmp_path / "data")
    if request.param == "service":
        async for built in retriever_service(settings):
            await built.writer.replace_sources([await batch(s, t) for s, t in CORPUS.items()])
            yield built
        return
    if request.param == "redis":
        import redis

        url = request.getfixturevalue("redis_server")
        with redis.Redis.from_url(url, protocol=2) as connection:
            connection.flushall()
        settings = Settings(chatqna_data_dir=tmp_path / "data", redis_url=url)
    if request.param == "cluster":
        import redis.cluster

        url = request.getfixturevalue("redis_cluster_url")
        with redis.cluster.RedisCluster.from_url(url, protocol=2) as connection:
            connection.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        settings = Settings(chatqna_data_dir=tmp_path / "data", redis_url=url)
    if request.param == "embedded-graph":  # the HNSW graph past the exact size (here 0)
        settings = Settings(chatqna_data_dir=tmp_path / "data", chatqna_embedded_exact_max_chunks=0)
    index = await build_retriever(settings, EMBEDDER)
    if request.param == "recording":
        index = RecordingRetriever(index)
    await index.replace_sources([await batch(s, t) for s, t in CORPUS.items()])
    if request.param == "embedded-graph":
        assert isinstance(index, EmbeddedHybridIndex) and index.wait_for_graph(timeout=60)
    yield Subject(index, index, request.param)
    await index.aclose()


async def search(
    retriever: Retriever, text: str, near: str, k: int, *, hybrid: bool = True
) -> list[ScoredChunk]:
    """Search with `text` for BM25 and the embedding of `near` for the dense leg."""
    vector = (await EMBEDDER.embed([near]))[0]
    return await retriever.search(SearchQuery(text, vector, k, hybrid))


def texts(results: list[ScoredChunk]) -> list[str]:
    return [r.chunk.text for r in results]


async def test_every_written_source_is_listed_with_its_chunk_count(subject: Subject) -> None:
    listed = sorted((info.source, info.chunks) for info in await subject.retriever.list_sources())
    assert listed == [("a.md", 2), ("b.md", 2), ("c.md", 1)]


async def test_the_dense_leg_puts_the_nearest_chunk_first(subject: Subject) -> None:
    target = CORPUS["b.md"][0]
    results = await search(subject.retriever, target, target, 3, hybrid=False)
    assert len(results) == 3 and results[0].chunk.text == target
    assert results[0].chunk.source == "b.md"
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)


async def test_hybrid_search_finds_what_either_leg_ranks_first(subject: Subject) -> None:
    dense_best, bm25_best = CORPUS["a.md"][0], CORPUS["c.md"][0]
    results = await search(subject.retriever, "invoices billing contact", dense_best, 2)
    assert sorted(texts(results)) == sorted([dense_best, bm25_best])
    assert all("fusion" in r.scores for r in results)


async def test_the_bm25_leg_finds_a_chunk_by_words_only_its_title_holds(
    subject: Subject,
) -> None:
    text = "Keys rotate every ninety days."
    await subject.writer.replace_sources([await batch("d.md", [text], title="Security policy")])
    unrelated = (await EMBEDDER.embed([CORPUS["b.md"][0]]))[0]
    query = SearchQuery("security policy", unrelated, 1, fusion_weights=(0.0, 1.0))
    results = await subject.retriever.search(query)
    assert texts(results) == [text]  # the text a user sees carries no title line
    assert results[0].chunk.title == "Security policy"


@pytest.mark.parametrize("hybrid", [False, True])
async def test_a_k_beyond_the_corpus_returns_every_chunk_once(
    subject: Subject, hybrid: bool
) -> None:
    results = await search(subject.retriever, "plans", "plans", 50, hybrid=hybrid)
    every = sorted(text for chunks in CORPUS.values() for text in chunks)
    assert sorted(texts(results)) == every
    assert len({r.chunk.id for r in results}) == len(every)


async def test_replacing_a_source_replaces_all_its_chunks(subject: Subject) -> None:
    await subject.writer.replace_sources([await batch("a.md", ["Refund requests go by email."])])
    listed = {info.source: info.chunks for info in await subject.retriever.list_sources()}
    assert listed == {"a.md": 1, "b.md": 2, "c.md": 1}
    found = texts(await search(subject.retriever, "refund", "refund", 50, hybrid=False))
    assert "Refund requests go by email." in found
    assert not set(CORPUS["a.md"]) & set(found)


async def test_deleting_sources_removes_their_chunks(subject: Subject) -> None:
    assert await subject.retriever.delete_sources(["b.md"]) == 2
    assert sorted(i.source for i in await subject.retriever.list_sources()) == ["a.md", "c.md"]
    found = texts(await search(subject.retriever, "exports", "exports", 50, hybrid=False))
    assert not set(CORPUS["b.md"]) & set(found)
    assert await subject.retriever.delete_sources(None) == 3
    assert await subject.retriever.list_sources() == []
    assert await search(subject.retriever, "plans", "plans", 5) == []


# What `describe` (the readiness probe's body) says of each, with CORPUS written: 5 chunks
# of 3 sources at the hashing embedder's 64 dimensions, under the default settings.
INDEX_FIGURES = {"chunks": 5, "sources": 3, "dimension": 64}
REDIS_FIGURES = {**INDEX_FIGURES, "index": "rag-redis", "algorithm": "HNSW", "indexing": False}
DESCRIBED = {
    "embedded": {"kind": "embedded", **INDEX_FIGURES, "exact_max_chunks": 1_000_000},
    "embedded-graph": {"kind": "embedded", **INDEX_FIGURES, "exact_max_chunks": 0},
    "service": {"kind": "remote", "endpoint": "http://localhost:7000"},
    "recording": {"kind": "embedded", **INDEX_FIGURES, "exact_max_chunks": 1_000_000},
    "redis": {"kind": "redis", **REDIS_FIGURES},
    "cluster": {"kind": "redis-cluster", **REDIS_FIGURES},
}


async def test_describe_reports_readiness(subject: Subject) -> None:
    described = await subject.retriever.describe()
    expected = DESCRIBED[subject.name]
    assert {key: described.get(key) for key in expected} == expected
    if subject.name == "cluster":
        assert len(described["primaries"]) == 3


async def test_the_service_client_refuses_writes(tmp_path: Path) -> None:
    async for built in retriever_service(Settings(chatqna_data_dir=tmp_path / "data")):
        with pytest.raises(NotSupported):
            await built.retriever.replace_sources([await batch("a.md", ["text"])])
