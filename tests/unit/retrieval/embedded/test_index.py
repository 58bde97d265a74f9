"""The embedded hybrid index: dense + BM25 search, source replacement, atomic persistence,
and two instances over one directory."""

from __future__ import annotations

import asyncio
import contextvars
import errno
import fcntl
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import SearchQuery, SourceBatch
from chatqna.backends.vectors import l2_normalise
from chatqna.documents import Chunk, chunk_id_for
from chatqna.errors import IndexUnavailable, ServiceUnavailable
from chatqna.ingest.dataprep import IngestFile, ingest_files
from chatqna.retrieval.embedded.chunk_store import STORE_FILE
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex

pytestmark = pytest.mark.anyio

DIM = 256
EMBEDDER = HashingEmbedder(DIM)  # only .vector() is used here, which records nothing

POLICIES = [
    "Refunds are issued to the original card within fourteen days of the invoice.",
    "Shipping uses tracked couriers; delivery takes three working days.",
    "Reset your password from the login page using the emailed link.",
]
HARDWARE = [
    "Warranty repairs cover broken hardware for two years.",
    "Support desk opening hours are nine to five; ask about zebra stickers.",
]


def vectors(texts: Sequence[str]) -> np.ndarray:
    return l2_normalise(np.vstack([EMBEDDER.vector(t) for t in texts]))


def batch(source: str, texts: Sequence[str], digest: str = "h1") -> SourceBatch:
    chunks = [
        Chunk(chunk_id_for(source, i), text, source, title=source, index=i)
        for i, text in enumerate(texts)
    ]
    return SourceBatch(source, chunks, vectors(texts), digest)


def query(text: str, k: int = 3, *, hybrid: bool = True, like: str | None = None) -> SearchQuery:
    return SearchQuery(text, vectors([like or text])[0], k, hybrid)


async def open_index(directory: Path, **kwargs: object) -> EmbeddedHybridIndex:
    options: dict[str, object] = {"embedder_name": EMBEDDER.name, "dimension": DIM, **kwargs}
    return await EmbeddedHybridIndex.open(directory, **options)  # type: ignore[arg-type]


@pytest.fixture
async def index(tmp_path: Path) -> EmbeddedHybridIndex:
    store = await open_index(tmp_path)
    await store.replace_sources(
        [batch("policies.md", POLICIES, "hash-p"), batch("hardware.md", HARDWARE, "hash-h")]
    )
    return store


def texts(results: Sequence[object]) -> list[str]:
    return [r.chunk.text for r in results]  # type: ignore[attr-defined]


async def test_open_on_empty_directory(tmp_path: Path) -> None:
    store = await open_index(tmp_path)
    assert store.loaded_from_disk is False
    assert await store.list_sources() == []
    assert await store.search(query("refund")) == []
    description = await store.describe()
    assert description["chunks"] == 0 and description["generation"] == 0


async def test_dense_only_search(index: EmbeddedHybridIndex) -> None:
    results = await index.search(query("refund to my card after the invoice", hybrid=False))
    assert results[0].chunk.text == POLICIES[0]
    assert results[0].chunk.source == "policies.md"
    assert all(set(r.scores) == {"dense"} for r in results)
    assert all(r.score == r.scores["dense"] for r in results)
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    question = vectors(["refund to my card after the invoice"])[0]
    expected = float(vectors([POLICIES[0]])[0] @ question)
    assert results[0].score == pytest.approx(expected, rel=1e-5)
    assert np.allclose(results[0].embedding, vectors([POLICIES[0]])[0])


async def test_hybrid_search(index: EmbeddedHybridIndex) -> None:
    results = await index.search(query("password reset login", k=3))
    assert results[0].chunk.text == POLICIES[2]
    assert all(set(r.scores) == {"dense", "bm25", "fusion"} for r in results)
    assert all(r.score == r.scores["fusion"] for r in results)
    top = results[0]
    assert top.score == pytest.approx(2 / 61)  # first in both legs, rrf k=60
    assert top.scores["bm25"] > 0
    assert top.scores["dense"] > 0.5


@pytest.mark.parametrize("hybrid", [True, False])
@pytest.mark.parametrize("k", [1, 2, 5, 10])
async def test_k_limits_results(index: EmbeddedHybridIndex, k: int, hybrid: bool) -> None:
    results = await index.search(query("refund shipping warranty", k=k, hybrid=hybrid))
    assert len(results) == min(k, 5)
    assert len({r.chunk.id for r in results}) == len(results)


async def test_bm25_only_match_enters_hybrid_but_not_dense(index: EmbeddedHybridIndex) -> None:
    # The text mentions "zebra" (only in HARDWARE[1]); the vector points at the refund passage.
    dense = await index.search(query("zebra", k=2, hybrid=False, like=POLICIES[0]))
    assert dense[0].chunk.text == POLICIES[0]
    assert HARDWARE[1] not in texts(dense)
    # Each leg's best 2 fused: zebra only comes from BM25.
    hybrid = index.search_sync(query("zebra", k=2, hybrid=True, like=POLICIES[0]), candidates=2)
    assert texts(hybrid) == [POLICIES[0], HARDWARE[1]]
    zebra = hybrid[1]
    assert zebra.scores["bm25"] > 0
    assert zebra.score == pytest.approx(1 / 61)
    assert hybrid[0].scores["bm25"] == 0.0
    # Each leg's best 50 fused (the default): the dense leg ranks zebra too, lower, and the
    # two legs' agreement puts it first.
    deep = await index.search(query("zebra", k=2, hybrid=True, like=POLICIES[0]))
    assert texts(deep)[0] == HARDWARE[1]
    rank = texts(await index.search(query("zebra", 5, hybrid=False, like=POLICIES[0])))
    assert deep[0].score == pytest.approx(1 / 61 + 1 / (61 + rank.index(HARDWARE[1])))


async def test_reingesting_a_source_replaces_its_chunks(index: EmbeddedHybridIndex) -> None:
    await index.replace_sources([batch("policies.md", ["Refunds now take thirty days."], "p2")])
    results = await index.search(query("refund invoice card", k=10))
    assert len(results) == 3  # 1 new policy chunk + 2 hardware chunks
    assert "Refunds now take thirty days." in texts(results)
    assert not set(POLICIES) & set(texts(results))
    assert len({r.chunk.id for r in results}) == 3
    sources = {s.source: (s.chunks, s.content_hash) for s in await index.list_sources()}
    assert sources == {"policies.md": (1, "p2"), "hardware.md": (2, "hash-h")}


async def test_list_sources_counts_and_hashes(index: EmbeddedHybridIndex) -> None:
    listed = await index.list_sources()
    assert [(s.source, s.chunks, s.content_hash) for s in listed] == [
        ("hardware.md", 2, "hash-h"),
        ("policies.md", 3, "hash-p"),
    ]
    assert index.content_hash("policies.md") == "hash-p"
    assert index.content_hash("missing.md") is None


async def test_delete_one_source(index: EmbeddedHybridIndex) -> None:
    assert await index.delete_sources(["policies.md"]) == 3
    assert [s.source for s in await index.list_sources()] == ["hardware.md"]
    results = await index.search(query("refund invoice", k=10))
    assert sorted(texts(results)) == sorted(HARDWARE)
    assert await index.delete_sources(["policies.md"]) == 0
    assert await index.delete_sources(["never-ingested.md"]) == 0
    assert len(await index.list_sources()) == 1


async def test_delete_all_sources(index: EmbeddedHybridIndex, tmp_path: Path) -> None:
    assert await index.delete_sources(None) == 5
    assert await index.list_sources() == []
    assert await index.search(query("refund")) == []
    reopened = await open_index(tmp_path)
    assert await reopened.list_sources() == []


async def test_reopen_sees_same_index_without_embedding(
    index: EmbeddedHybridIndex, tmp_path: Path
) -> None:
    probes = [query("refund invoice"), query("zebra", like=POLICIES[0], hybrid=False)]
    before = [await index.search(q) for q in probes]
    embedder = HashingEmbedder(DIM)
    reopened = await EmbeddedHybridIndex.open(tmp_path, embedder_name=embedder.name, dimension=DIM)
    assert reopened.loaded_from_disk is True
    assert (await reopened.describe())["loaded_from_disk"] is True
    assert await reopened.list_sources() == await index.list_sources()
    assert [await reopened.search(q) for q in probes] == before
    assert embedder.batches == []


@pytest.mark.parametrize(
    ("name", "dimension"), [("other-model", DIM), (EMBEDDER.name, 128)], ids=["name", "dim"]
)
async def test_reopen_with_other_embedder_is_refused(
    index: EmbeddedHybridIndex, tmp_path: Path, name: str, dimension: int
) -> None:
    with pytest.raises(IndexUnavailable) as caught:
        await EmbeddedHybridIndex.open(tmp_path, embedder_name=name, dimension=dimension)
    message = caught.value.message
    assert EMBEDDER.name in message and str(DIM) in message
    assert name in message and str(dimension) in message


def _garbage_store(directory: Path) -> None:
    (directory / STORE_FILE).write_bytes(b"this is not an index" * 300)
    for suffix in ("-wal", "-shm"):
        (directory / f"{STORE_FILE}{suffix}").unlink(missing_ok=True)


def _other_format(directory: Path) -> None:
    with sqlite3.connect(directory / STORE_FILE) as db:
        db.execute("UPDATE meta SET value='7' WHERE key='format'")


CORRUPTIONS = {
    "garbage_store": _garbage_store,
    "other_format": _other_format,
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
async def test_unreadable_index_is_refused_with_how_to_rebuild(
    index: EmbeddedHybridIndex, tmp_path: Path, corruption: str
) -> None:
    await index.aclose()
    CORRUPTIONS[corruption](tmp_path)
    with pytest.raises(IndexUnavailable, match=r"chatqna ingest --rebuild"):
        await open_index(tmp_path)


async def test_a_data_directory_on_a_file_system_without_flock_is_refused_at_open(
    index: EmbeddedHybridIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await index.aclose()  # leaves its writer.lock behind, as every data directory has one

    def without_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", without_flock)
    with pytest.raises(IndexUnavailable, match=r"cannot open .*Function not implemented"):
        await open_index(tmp_path)


async def test_failed_write_changes_nothing(index: EmbeddedHybridIndex, tmp_path: Path) -> None:
    probe = query("refund invoice courier", k=10)
    before_results = await index.search(probe)
    before_sources = await index.list_sources()
    # The second batch's text cannot be stored: the transaction fails after the first
    # batch's rows went in, and is rolled back whole.
    unstorable = Chunk("bad-0000", ["not", "text"], "new.md")  # type: ignore[arg-type]
    bad = SourceBatch("new.md", [unstorable], vectors(["New."]), "n1")
    with pytest.raises(IndexUnavailable, match="cannot write"):
        await index.replace_sources([batch("policies.md", ["Brand new refund text."], "p2"), bad])
    assert await index.search(probe) == before_results
    assert await index.list_sources() == before_sources
    reopened = await open_index(tmp_path)
    assert await reopened.search(probe) == before_results
    assert await reopened.list_sources() == before_sources


async def test_a_second_instance_sees_the_first_ones_writes(
    index: EmbeddedHybridIndex, tmp_path: Path
) -> None:
    """Two instances over one directory (as two processes would open it): each search
    catches up with the other's commits."""
    other = await open_index(tmp_path)
    assert len(await other.search(query("zebra stickers", k=10))) == 5
    await index.replace_sources([batch("giraffes.md", ["Giraffes eat acacia leaves."])])
    found = await other.search(query("giraffes acacia", k=1))
    assert texts(found) == ["Giraffes eat acacia leaves."] and found[0].scores["bm25"] > 0
    assert await other.delete_sources(["policies.md"]) == 3
    left = await index.search(query("refund invoice", k=10))
    assert sorted(texts(left)) == sorted([*HARDWARE, "Giraffes eat acacia leaves."])
    assert (await index.describe())["generation"] == (await other.describe())["generation"]


@pytest.mark.parametrize("shape", [(2, DIM), (3, DIM - 1), (3,)])
async def test_embeddings_shape_mismatch(index: EmbeddedHybridIndex, shape: tuple[int]) -> None:
    good = batch("policies.md", POLICIES)
    bad = SourceBatch("policies.md", good.chunks, np.zeros(shape, np.float32), "x")
    with pytest.raises(ValueError, match=r"policies\.md"):
        await index.replace_sources([bad])
    assert [s.chunks for s in await index.list_sources()] == [2, 3]


async def test_query_vector_of_wrong_dimension(index: EmbeddedHybridIndex) -> None:
    for hybrid in (True, False):
        wrong = SearchQuery("refund", np.ones(DIM + 1, np.float32), 3, hybrid)
        with pytest.raises(IndexUnavailable, match="dimensions"):
            await index.search(wrong)


# --- per-leg RRF weights ---------------------------------------------------------------
WEIGHTED_DOCS = {
    "a.md": "# A\n\n## A\nzebra zebra zebra migration across the plains",
    "b.md": "# B\n\n## B\nlions hunt at dusk on the savannah plains",
    "c.md": "# C\n\n## C\nwildlife photography tips for the savannah",
}


async def _index(tmp_path: Path) -> tuple[EmbeddedHybridIndex, HashingEmbedder]:
    embedder = HashingEmbedder()
    index = await EmbeddedHybridIndex.open(tmp_path, embedder_name=embedder.name, dimension=64)
    await ingest_files(
        [IngestFile(k, v.encode()) for k, v in WEIGHTED_DOCS.items()], embedder, index
    )
    return index, embedder


async def test_bm25_weight_zero_gives_the_dense_order(tmp_path: Path) -> None:
    index, embedder = await _index(tmp_path)
    vector = (await embedder.embed(["lions savannah dusk"]))[0]
    dense = await index.search(SearchQuery("zebra", vector, 3, hybrid=False))
    fused = await index.search(SearchQuery("zebra", vector, 3, fusion_weights=(1.0, 0.0)))
    assert [h.chunk.source for h in fused] == [h.chunk.source for h in dense]


async def test_fusion_scores_are_the_weighted_reciprocal_ranks(tmp_path: Path) -> None:
    index, embedder = await _index(tmp_path)
    vector = (await embedder.embed(["lions savannah dusk"]))[0]
    dense = [h.chunk.source for h in await index.search(SearchQuery("x", vector, 3, False))]
    for weights in ((1.0, 1.0), (1.0, 0.2), (0.2, 1.0)):
        hits = await index.search(SearchQuery("zebra", vector, 3, fusion_weights=weights))
        for hit in hits:
            # "zebra" occurs in a.md only: BM25 rank 1 there, no BM25 rank elsewhere.
            expected = weights[0] / (60 + dense.index(hit.chunk.source) + 1)
            if hit.chunk.source == "a.md":
                expected += weights[1] / 61
            assert hit.scores["fusion"] == pytest.approx(expected), (weights, hit.chunk.source)
        ranked = sorted(hits, key=lambda h: -h.scores["fusion"])
        assert [h.chunk.id for h in hits] == [h.chunk.id for h in ranked]


def many_passages(count: int) -> list[str]:
    words = ["refund", "invoice", "courier", "password", "warranty", "desk", "zebra", "card"]
    rng = np.random.default_rng(5)
    return [
        f"passage {n} " + " ".join(rng.choice(words, size=6).tolist()) + f" item{n % 37}"
        for n in range(count)
    ]


async def test_past_the_exact_size_the_graph_answers_as_exact_search_does(
    tmp_path: Path,
) -> None:
    passages = many_passages(600)
    exact = await open_index(tmp_path / "exact")
    graph = await open_index(tmp_path / "graph", exact_max=100)
    for store in (exact, graph):
        await store.replace_sources([batch("many.md", passages)])
    assert graph.wait_for_graph(timeout=60) and not exact.wait_for_graph()
    assert "HNSW" in (await graph.describe())["engine"]
    assert "int8 scan" in (await exact.describe())["engine"]
    for text in ("refund invoice item3", "zebra desk courier", "passage 17 warranty card"):
        for hybrid in (True, False):
            want = await exact.search(query(text, k=5, hybrid=hybrid))
            got = await graph.search(query(text, k=5, hybrid=hybrid))
            assert [r.chunk.id for r in got] == [r.chunk.id for r in want]
            assert [r.scores["dense"] for r in got] == pytest.approx(
                [r.scores["dense"] for r in want], abs=1e-6
            )


async def test_writes_after_the_graph_is_built_reach_it(tmp_path: Path) -> None:
    store = await open_index(tmp_path, exact_max=0)
    await store.replace_sources([batch("many.md", many_passages(300))])
    assert store.wait_for_graph(timeout=60)
    await store.replace_sources([batch("policies.md", POLICIES)])
    found = await store.search(query(POLICIES[2], k=1, hybrid=False))
    assert texts(found) == [POLICIES[2]]
    await store.delete_sources(["policies.md"])
    assert POLICIES[2] not in texts(await store.search(query(POLICIES[2], k=5, hybrid=False)))
    # A second process opening the directory builds its own graph from the store.
    other = await open_index(tmp_path, exact_max=0)
    assert other.wait_for_graph(timeout=60)
    assert (await other.describe())["chunks"] == 300


async def test_negative_exact_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exact_max"):
        await open_index(tmp_path, exact_max=-1)


async def test_a_failed_graph_build_leaves_search_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise MemoryError("no room for the graph")

    monkeypatch.setattr("chatqna.retrieval.embedded.index.VectorGraph", broken)
    store = await open_index(tmp_path, exact_max=0)
    await store.replace_sources([batch("policies.md", POLICIES)])
    assert store.wait_for_graph(timeout=60) is False
    assert "building the vector graph failed" in caplog.text
    assert "int8 scan" in (await store.describe())["engine"]
    assert texts(await store.search(query(POLICIES[1], k=1, hybrid=False))) == [POLICIES[1]]


async def test_a_search_does_not_wait_for_asyncio_s_default_threads(
    index: EmbeddedHybridIndex,
) -> None:
    # Every thread of the default pool busy (uploads being parsed, say): searches have
    # threads of their own.
    loop = asyncio.get_running_loop()
    release = threading.Event()
    busy = [
        loop.run_in_executor(None, release.wait) for _ in range(min(32, (os.cpu_count() or 1) + 4))
    ]
    try:
        async with asyncio.timeout(10):
            results = await index.search(query("password reset login"))
        assert results[0].chunk.text == POLICIES[2]
    finally:
        release.set()
        await asyncio.gather(*busy)


# --- closing ---------------------------------------------------------------------------
async def test_closing_waits_for_a_running_search_before_it_closes_the_store(
    index: EmbeddedHybridIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    real_chunks = index.store.chunks

    def slow_chunks(rows: object) -> object:
        started.set()
        release.wait(10)  # the search is between its reads when the service stops
        return real_chunks(rows)  # type: ignore[arg-type]

    monkeypatch.setattr(index.store, "chunks", slow_chunks)
    search = asyncio.create_task(index.search(query("password reset login")))
    assert await asyncio.to_thread(started.wait, 10)
    closing = asyncio.create_task(index.aclose())
    await asyncio.sleep(0.1)
    assert not closing.done()  # the store stays open while the search reads it
    release.set()
    async with asyncio.timeout(10):
        assert texts(await search)[0] == POLICIES[2]
        await closing
    assert index.store._opened == []  # every connection closed, none opened after


async def test_work_that_reaches_a_closed_index_is_refused_as_a_shutdown(
    index: EmbeddedHybridIndex,
) -> None:
    await index.aclose()
    work = {
        "search": lambda: index.search(query("refund")),
        "list_sources": index.list_sources,
        "describe": index.describe,
        "replace_sources": lambda: index.replace_sources([batch("new.md", HARDWARE)]),
        "delete_sources": lambda: index.delete_sources(["policies.md"]),
    }
    for name, call in work.items():
        with pytest.raises(ServiceUnavailable, match="shutting down") as refused:
            await call()
        assert refused.value.status_code == 503, name
        assert refused.value.envelope()["error"] == "service_unavailable", name
    with pytest.raises(ServiceUnavailable):
        index.content_hash("policies.md")
    assert index.store._opened == []  # refused before the store was touched again


async def test_closing_lets_a_write_in_progress_finish_before_it_closes_the_store(
    index: EmbeddedHybridIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    real_replace = index.store.replace

    def slow_replace(batches: Sequence[SourceBatch]) -> object:
        started.set()
        release.wait(10)  # an upload being written when the service stops
        return real_replace(batches)

    monkeypatch.setattr(index.store, "replace", slow_replace)
    write = asyncio.create_task(index.replace_sources([batch("new.md", ["Zebra stickers."])]))
    assert await asyncio.to_thread(started.wait, 10)
    closing = asyncio.create_task(index.aclose())
    release.set()
    async with asyncio.timeout(10):
        await write
        await closing
    assert index.store._opened == []  # the write's connection closed too, none opened after
    reopened = await open_index(tmp_path)
    assert "new.md" in {s.source for s in await reopened.list_sources()}
    await reopened.aclose()


SEARCH_TAG: contextvars.ContextVar[str] = contextvars.ContextVar("search_tag", default="")


async def test_a_search_runs_in_its_caller_s_context(
    index: EmbeddedHybridIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real_search = index.search_sync

    def tagged(probe: SearchQuery) -> object:
        seen.append(SEARCH_TAG.get())
        return real_search(probe)

    monkeypatch.setattr(index, "search_sync", tagged)
    SEARCH_TAG.set("request-7")
    await index.search(query("refund"))
    assert seen == ["request-7"]


async def test_hybrid_fuses_deeper_legs_and_keeps_k(tmp_path: Path) -> None:
    embedder = HashingEmbedder()
    index = await EmbeddedHybridIndex.open(
        tmp_path, embedder_name=embedder.name, dimension=64, rrf_candidates=6
    )
    files = [
        IngestFile(f"doc{i}.md", f"# D{i}\n\nrefund topic {i} plans {'refund ' * (i % 3)}".encode())
        for i in range(8)
    ]
    await ingest_files(files, embedder, index)
    vector = (await embedder.embed(["refund plans"]))[0]
    hits = await index.search(SearchQuery("refund plans", vector, 3))
    # The best 3 of the fusion of each leg's best 6, not the fusion of each leg's best 3.
    deep = await index.search(SearchQuery("refund plans", vector, 6))
    assert [h.chunk.id for h in hits] == [h.chunk.id for h in deep[:3]]
    shallow = index.search_sync(SearchQuery("refund plans", vector, 3), candidates=3)
    assert len(hits) == len(shallow) == 3
    # Dense-only search has no fusion: the top 3 by cosine either way.
    dense = await index.search(SearchQuery("refund plans", vector, 3, hybrid=False))
    assert [h.scores["dense"] for h in dense] == sorted(
        (h.scores["dense"] for h in dense), reverse=True
    )
    with pytest.raises(ValueError):
        EmbeddedHybridIndex(tmp_path, embedder_name="x", dimension=4, rrf_candidates=0)
