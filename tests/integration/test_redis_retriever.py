"""The Redis retriever against a real Redis Stack, and the same contract as the embedded index.

The contract cases run over both `EmbeddedHybridIndex` and `RedisHybridIndex` (FLAT, exact
search) on the sample corpus embedded with the real MiniLM model. The two BM25 legs use
different formulas (tantivy's BM25 in the embedded index, RediSearch's `BM25STD` in Redis),
so across stores the checks are on relevance: the same dense rankings, the same best
passage, mostly the same top k, the same passages matched. Redis's BM25 is checked to the
last bit against `tests.oracles.redisearch_bm25.BM25Index`, the reference model of its scorer.
Then Redis-only checks:
hostile query text cannot break the server, data survives a restart, `list_sources` reads
no chunk, and an index built for another embedder is refused.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from chatqna.backends.local_embedder import OnnxMiniLMEmbedder
from chatqna.backends.protocols import Retriever, SearchQuery, SourceBatch
from chatqna.composition import build_retriever
from chatqna.documents import Chunk, ScoredChunk, chunk_id_for
from chatqna.errors import EvictingIndexServer, IndexUnavailable
from chatqna.ingest.dataprep import collect_files, ingest_files
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.query import WeightedQuery
from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams, bm25_query
from chatqna.settings import Settings
from tests.integration.conftest import SAMPLE_CORPUS
from tests.integration.redis_server import RedisStackProcess, redis_stack_server
from tests.oracles.redisearch_bm25 import BM25Index

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

EXACT = VectorIndexParams(algorithm="FLAT")
QUESTIONS = [
    "How do I get a refund for my annual plan?",
    "How long does a refund take to reach my card?",
    "Can I export my workspace data as CSV?",
    "How do I reset my password or turn on two-factor sign-in?",
    "What happens to my data after I cancel?",
    "Which integrations are available?",
    "What do promo credits apply to?",
    "Compare the plans and their seat prices",
]
HOSTILE = [
    "is it password",
    "is | it | password",
    "the and of refund",
    "@foo|bar",
    "foo@bar.com",
    "(unbalanced",
    "refund%",
    "-warranty",
    "",
    "   ",
    "*",
    '"quoted',
    "$vec",
    "~tilde {brace} [1 2]",
    "\\",
    "@content:(is | it)",
    "naïve café straße İstanbul",
    "foo_bar",
]
# Query syntax, stop words and a few letters: mostly nonsense queries, as a fuzzer sees them.
QUERY_SYNTAX = "@|()-%*~{}[]\"':;$\\_=><!,. is it the or a refund password"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class CachingEmbedder:
    """The real MiniLM embedder, remembering vectors so the corpus is embedded once."""

    def __init__(self) -> None:
        self.inner = OnnxMiniLMEmbedder(threads=2)
        self.name = self.inner.name
        self.dimension = self.inner.dimension
        self.max_batch = self.inner.max_batch
        self._vectors: dict[str, np.ndarray] = {}

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            for text, vector in zip(missing, await self.inner.embed(missing), strict=True):
                self._vectors[text] = vector
        return np.vstack([self._vectors[t] for t in texts])

    async def describe(self) -> dict[str, Any]:
        return await self.inner.describe()

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="module")
def embedder() -> CachingEmbedder:
    return CachingEmbedder()


async def open_memory(embedder: CachingEmbedder, directory: Path) -> EmbeddedHybridIndex:
    return await EmbeddedHybridIndex.open(
        directory, embedder_name=embedder.name, dimension=embedder.dimension
    )


async def open_redis(embedder: CachingEmbedder, url: str) -> RedisHybridIndex:
    return await RedisHybridIndex.open(
        url, embedder_name=embedder.name, dimension=embedder.dimension, vector=EXACT
    )


@pytest.fixture(params=["memory", "redis"])
async def store(
    request: pytest.FixtureRequest, embedder: CachingEmbedder, tmp_path: Path
) -> AsyncIterator[Retriever]:
    index: Retriever
    if request.param == "memory":
        index = await open_memory(embedder, tmp_path / "index")
    else:
        index = await open_redis(embedder, request.getfixturevalue("redis_url"))
    await ingest_files(collect_files([SAMPLE_CORPUS]), embedder, index)
    yield index
    await index.aclose()


async def ask(
    store: Retriever, embedder: CachingEmbedder, text: str, k: int = 4, *, hybrid: bool = True
) -> list[ScoredChunk]:
    vector = (await embedder.embed([text]))[0]
    return await store.search(SearchQuery(text, vector, k, hybrid))


def ids(results: Sequence[ScoredChunk]) -> list[str]:
    return [r.chunk.id for r in results]


# --- the contract, over both implementations ------------------------------------------------
async def test_ingest_lists_every_source(store: Retriever, embedder: CachingEmbedder) -> None:
    files = collect_files([SAMPLE_CORPUS])
    listed = await store.list_sources()
    assert [s.source for s in listed] == sorted(f.source for f in files)
    assert all(s.chunks > 0 and len(s.content_hash) == 64 for s in listed)
    again = await ingest_files(files, embedder, store)
    assert {r.status for r in again} == {"unchanged"}
    assert await store.list_sources() == listed
    assert (await store.describe())["chunks"] == sum(s.chunks for s in listed)


async def test_hybrid_search(store: Retriever, embedder: CachingEmbedder) -> None:
    results = await ask(store, embedder, "How long does a refund take to reach my card?")
    assert results[0].chunk.source == "refunds.md"
    assert "5 to 10 business days" in results[0].chunk.text
    assert len(results) == 4 and len(set(ids(results))) == 4
    assert all(set(r.scores) == {"dense", "bm25", "fusion"} for r in results)
    assert all(r.score == r.scores["fusion"] for r in results)
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    top = results[0]
    assert top.scores["bm25"] > 0 and top.scores["dense"] > 0.3
    stored = await embedder.embed([top.chunk.indexed_text])
    assert top.embedding is not None
    assert np.allclose(top.embedding, stored[0], atol=1e-6)


async def test_dense_only_search(store: Retriever, embedder: CachingEmbedder) -> None:
    question = "Can I export my workspace data as CSV?"
    results = await ask(store, embedder, question, k=5, hybrid=False)
    assert results[0].chunk.source == "export.md"
    assert all(set(r.scores) == {"dense"} and r.score == r.scores["dense"] for r in results)
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    vectors = await embedder.embed([question, results[0].chunk.indexed_text])
    assert results[0].score == pytest.approx(float(vectors[0] @ vectors[1]), abs=1e-5)


@pytest.mark.parametrize("hybrid", [True, False])
async def test_k_limits_results(store: Retriever, embedder: CachingEmbedder, hybrid: bool) -> None:
    for k in (1, 3, 10):
        results = await ask(store, embedder, "refund invoice plan", k=k, hybrid=hybrid)
        assert len(results) == k and len(set(ids(results))) == k


async def test_delete_one_source(store: Retriever, embedder: CachingEmbedder) -> None:
    chunks = {s.source: s.chunks for s in await store.list_sources()}
    assert await store.delete_sources(["refunds.md"]) == chunks["refunds.md"]
    assert "refunds.md" not in {s.source for s in await store.list_sources()}
    results = await ask(store, embedder, "How do I get a refund?", k=10)
    assert "refunds.md" not in {r.chunk.source for r in results}
    assert await store.delete_sources(["refunds.md"]) == 0
    assert await store.delete_sources(["never-ingested.md"]) == 0
    assert len(await store.list_sources()) == len(chunks) - 1


async def test_delete_everything(store: Retriever, embedder: CachingEmbedder) -> None:
    total = sum(s.chunks for s in await store.list_sources())
    assert await store.delete_sources(None) == total
    assert await store.list_sources() == []
    assert await ask(store, embedder, "refund") == []
    assert (await store.describe())["chunks"] == 0


async def test_reingest_replaces_a_source(store: Retriever, embedder: CachingEmbedder) -> None:
    before = {s.source: s.chunks for s in await store.list_sources()}
    everything = await ask(store, embedder, "refund", k=100, hybrid=False)
    old_texts = {r.chunk.text for r in everything if r.chunk.source == "refunds.md"}
    assert len(old_texts) == before["refunds.md"] > 1
    new_text = "Refunds are now paid as zanzibar vouchers within thirty days."
    chunk = Chunk(chunk_id_for("refunds.md", 0), new_text, "refunds.md", "Refunds", 0)
    await store.replace_sources(
        [SourceBatch("refunds.md", [chunk], await embedder.embed([new_text]), "new-hash")]
    )
    results = await ask(store, embedder, "refund zanzibar vouchers", k=100)
    assert results[0].chunk.text == new_text
    assert len(set(ids(results))) == len(results) == sum(before.values()) - len(old_texts) + 1
    assert [r.chunk.text for r in results if r.chunk.source == "refunds.md"] == [new_text]
    assert not old_texts & {r.chunk.text for r in results}
    listed = {s.source: (s.chunks, s.content_hash) for s in await store.list_sources()}
    assert listed["refunds.md"] == (1, "new-hash")
    assert len(listed) == len(before)


async def test_embeddings_must_match_chunks(store: Retriever, embedder: CachingEmbedder) -> None:
    chunk = Chunk(chunk_id_for("x.md", 0), "text", "x.md")
    for shape in [(2, embedder.dimension), (1, embedder.dimension - 1), (embedder.dimension,)]:
        with pytest.raises(ValueError, match=r"x\.md"):
            await store.replace_sources([SourceBatch("x.md", [chunk], np.zeros(shape))])
    wrong = SearchQuery("refund", np.ones(embedder.dimension + 1, np.float32), 3)
    with pytest.raises(IndexUnavailable, match="dimensions"):
        await store.search(wrong)
    assert "x.md" not in {s.source for s in await store.list_sources()}


FOLLOW_UPS = [  # (an earlier question, the follow-up): the history-aware BM25 leg
    ("How do I get a refund for my annual plan?", "How long does that take?"),
    ("Can I export my workspace data as CSV?", "And after I cancel?"),
    ("Which integrations are available?", "Do they cost extra?"),
    ("How do I reset my password?", "What about two-factor sign-in?"),
]


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def assert_agreeing_rankings(
    memory: Sequence[ScoredChunk], remote: Sequence[ScoredChunk], *, overlap: float = 0.8
) -> None:
    """Both engines rank alike: as many passages, the same best one (when its lead is clear),
    most of the same top k, and BM25 scores within a few percent (b = 0.75 against 0.5)."""
    assert len(memory) == len(remote)
    shared = set(ids(memory)) & set(ids(remote))
    assert len(shared) >= overlap * len(memory), (ids(memory), ids(remote))
    if len(memory) > 1 and memory[0].score > memory[1].score * 1.05:
        assert ids(memory)[0] == ids(remote)[0]
    by_id = {r.chunk.id: r for r in remote}
    for mine in memory:
        theirs = by_id.get(mine.chunk.id)
        if theirs is not None and mine.scores["bm25"] > 0:
            assert relative(mine.scores["bm25"], theirs.scores["bm25"]) < 0.35, mine.chunk.id


class ReferenceBM25:
    """RediSearch's `BM25STD` computed in Python over the passages one store holds."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self.ids = [c.id for c in chunks]
        self.index = BM25Index([c.indexed_text for c in chunks], keys=self.ids)

    @classmethod
    async def of(cls, store: Retriever, embedder: CachingEmbedder) -> ReferenceBM25:
        every = await store.search(
            SearchQuery("", np.ones(embedder.dimension, np.float32), 10_000, hybrid=False)
        )
        return cls([r.chunk for r in every])

    def assert_scores(self, query: SearchQuery, results: Sequence[ScoredChunk]) -> None:
        """Redis's BM25 scores are the reference's, bit for bit; with the dense leg off, the
        BM25 matches come in the reference's order (ties by passage id)."""
        weighted = WeightedQuery.parse(query.text, query.bm25_history, query.bm25_history_weight)
        scores = self.index.scores(weighted)
        position = {chunk_id: i for i, chunk_id in enumerate(self.ids)}
        for result in results:
            assert result.scores["bm25"] == scores.get(position[result.chunk.id], 0.0)
        if query.fusion_weights[0] == 0.0:
            matched = [r.chunk.id for r in results if r.scores["bm25"] > 0]
            best = self.index.top(weighted, max(query.k, 50))[: len(matched)]
            assert matched == [self.ids[i] for i, _ in best]


async def test_both_stores_rank_alike(
    embedder: CachingEmbedder, tmp_path: Path, redis_url: str
) -> None:
    """The contract: the same dense rankings; for the weighted hybrid at several fusion
    weights and depths, and for the history-aware BM25 leg, rankings that agree (and Redis's
    BM25 exactly the reference scorer's)."""
    files = collect_files([SAMPLE_CORPUS])
    stores = [
        await open_memory(embedder, tmp_path / "index"),
        await open_redis(embedder, redis_url),
    ]
    for index in stores:
        await ingest_files(files, embedder, index)
    reference = await ReferenceBM25.of(stores[0], embedder)
    compared = 0
    for question in QUESTIONS:
        vector = (await embedder.embed([question]))[0]
        memory, remote = [await s.search(SearchQuery(question, vector, 5, False)) for s in stores]
        assert ids(remote) == ids(memory), question
        for mine, theirs in zip(memory, remote, strict=True):
            assert theirs.score == pytest.approx(mine.score, abs=1e-5)
        for k, weights in [(5, (1.0, 1.0)), (5, (1.0, 0.2)), (50, (1.0, 0.2)), (50, (0.0, 1.0))]:
            query = SearchQuery(question, vector, k, fusion_weights=weights)
            memory, remote = [await s.search(query) for s in stores]
            assert_agreeing_rankings(memory, remote)
            reference.assert_scores(query, remote)
            compared += len(memory)
    for earlier, follow_up in FOLLOW_UPS:
        vector = (await embedder.embed([follow_up]))[0]
        for weight in (0.3, 0.5):
            # BM25 alone (dense weight 0) shows the leg's own order; then the blend default.
            for weights in [(0.0, 1.0), (1.0, 0.2)]:
                query = SearchQuery(
                    follow_up, vector, 20, fusion_weights=weights,
                    bm25_history=earlier, bm25_history_weight=weight,
                )  # fmt: skip
                memory, remote = [await s.search(query) for s in stores]
                assert_agreeing_rankings(memory, remote)
                reference.assert_scores(query, remote)
                assert any(r.scores["bm25"] > 0 for r in memory)
                compared += len(memory)
    assert compared > 400
    for index in stores:
        await index.aclose()


async def test_tied_bm25_scores_in_both_stores(
    embedder: CachingEmbedder, tmp_path: Path, redis_url: str
) -> None:
    """Identical passages tie in both stores. Redis breaks BM25 ties by insertion order, and
    the ranking keeps the reference's order (by passage id); the embedded index returns the
    tied passages with equal scores, ahead of the non-matching one."""
    text = "Refunds are paid back to the original card within ten days."
    chunks = [Chunk(f"tie-{i:02d}", text, "ties.md", "Ties", i) for i in range(12)]
    other = Chunk("other-00", "Refund policy for annual plans.", "other.md", "Other", 0)
    vectors = await embedder.embed([text] * len(chunks) + [other.text])
    batches = [
        SourceBatch("ties.md", chunks[::-1], vectors[: len(chunks)][::-1], "h1"),
        SourceBatch("other.md", [other], vectors[len(chunks) :], "h2"),
    ]
    stores = [
        await open_memory(embedder, tmp_path / "index"),
        await open_redis(embedder, redis_url),
    ]
    for index in stores:
        await index.replace_sources(batches)
    reference = ReferenceBM25([*chunks, other])
    probe = (await embedder.embed(["original card"]))[0]
    for k in (3, 5, 13):
        query = SearchQuery("original card", probe, k, fusion_weights=(0.0, 1.0))
        memory, remote = [await s.search(query) for s in stores]
        reference.assert_scores(query, remote)
        assert ids(remote)[: min(k, 12)] == [f"tie-{i:02d}" for i in range(min(k, 12))]
        tied = memory[: min(k, 12)]
        assert {r.chunk.text for r in tied} == {text}
        assert len({r.scores["bm25"] for r in tied}) == 1 and tied[0].scores["bm25"] > 0
        assert len(set(ids(memory))) == len(memory) == k
    for index in stores:
        await index.aclose()


async def test_bm25_leg_on_random_passages(
    embedder: CachingEmbedder, tmp_path: Path, redis_url: str
) -> None:
    """Many terms, long histories, repeated words, non-ASCII words, the BM25 leg alone
    (dense weight 0): Redis scores exactly as the reference; the embedded index matches the
    same passages and ranks mostly the same ones first."""
    rng = np.random.default_rng(11)
    words = [f"w{i}" for i in range(60)] + ["café", "naïve", "straße", "σοφία", "x_y"]
    chunks = []
    for i in range(150):
        size = int(rng.integers(1, 60))
        text = " ".join(rng.choice(words[: int(rng.integers(2, len(words)))], size))
        chunks.append(Chunk(f"p{i:03d}", text, f"s{i % 7}.md", "", i))
    vectors = rng.standard_normal((len(chunks), embedder.dimension)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    batches = [
        SourceBatch(
            f"s{s}.md",
            [c for c in chunks if c.source == f"s{s}.md"],
            vectors[[i for i, c in enumerate(chunks) if c.source == f"s{s}.md"]],
        )
        for s in range(7)
    ]
    stores = [
        await open_memory(embedder, tmp_path / "index"),
        await open_redis(embedder, redis_url),
    ]
    for index in stores:
        await index.replace_sources(batches)
    reference = ReferenceBM25(chunks)
    shared = total = 0
    for _ in range(40):
        query_words = rng.choice(words, int(rng.integers(1, 25)))
        history_words = rng.choice(words, int(rng.integers(0, 40)))
        query = SearchQuery(
            " ".join(query_words), vectors[0], int(rng.integers(1, 60)), fusion_weights=(0.0, 1.0),
            bm25_history=" ".join(history_words), bm25_history_weight=float(rng.uniform(0.05, 1)),
        )  # fmt: skip
        memory, remote = [await s.search(query) for s in stores]
        reference.assert_scores(query, remote)
        matched = [{r.chunk.id for r in hits if r.scores["bm25"] > 0} for hits in (memory, remote)]
        if len(matched[1]) < query.k:  # every match fits in k: the very same passages
            assert matched[0] == matched[1]
        shared += len(set(ids(memory)) & set(ids(remote)))
        total += len(memory)
    assert shared >= 0.9 * total


# --- Redis only --------------------------------------------------------------------------------
def test_bm25_query_escapes_and_drops_stop_words() -> None:
    def query(text: str, history: str = "", weight: float = 0.0) -> str | None:
        return bm25_query(WeightedQuery.parse(text, history, weight))

    assert query("is it password") == "@terms:(password)"
    assert query("@foo|bar foo@bar.com") == "@terms:(foo | bar | com)"
    assert query("-warranty (unbalanced refund%") == "@terms:(warranty | unbalanced | refund)"
    assert query("snake_case") == "@terms:(snake\\_case)"
    assert query("is it the") is None
    assert query("") is None
    assert query("refund", "annual plan refund", 0.3) == (
        "@terms:(refund | (annual | plan) => { $weight: 0.3; })"
    )
    # One history term is listed twice at half the weight (a one-term group loses its weight).
    assert (
        query("refund", "annual", 0.3)
        == "@terms:(refund | (annual | annual) => { $weight: 0.15; })"
    )
    assert query("it", "annual plan", 0.3) == "@terms:(annual | plan) => { $weight: 0.3; }"


def test_hostile_query_text_never_breaks_the_server(
    embedder: CachingEmbedder, redis_url: str, redis_stack: RedisStackProcess
) -> None:
    with asyncio.Runner() as runner:
        index = runner.run(open_redis(embedder, redis_url))
        runner.run(ingest_files(collect_files([SAMPLE_CORPUS]), embedder, index))
        vector = runner.run(embedder.embed(["refund"]))[0]
        tried: list[str] = []

        @hypothesis_settings(
            max_examples=150,
            deadline=None,
            database=None,  # no example database in the working tree
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(text=st.text() | st.text(alphabet=QUERY_SYNTAX) | st.sampled_from(HOSTILE))
        @example(text="is it password")
        @example(text="is | it | password")
        @example(text="@foo|bar")
        def check(text: str) -> None:
            tried.append(text)
            results = runner.run(index.search(SearchQuery(text, vector, 4)))
            assert len(results) == 4
            assert redis_stack.alive(), (
                f"redis-server died on {text!r}:\n{redis_stack.log()[-2000:]}"
            )

        try:
            check()
        finally:
            runner.run(index.aclose())
    assert len(tried) >= 150
    assert redis_stack.alive()


def long_messages(chars: int = 8000) -> list[str]:
    """Messages of the API's longest (`CHATQNA_MAX_MESSAGE_CHARS`): a pasted page of the
    corpus with a question after it, and distinct made-up words around a few real ones."""
    corpus = " ".join(path.read_text() for path in sorted(SAMPLE_CORPUS.rglob("*.md")))
    question = "\n\nWhat does this say about refunds?"
    pasted = corpus[: chars - len(question)] + question
    words = ["refund", "refund", "invoice", "invoice"]
    while sum(len(w) + 1 for w in words) + 8 <= chars:
        words.append(f"w{len(words)}")
    return [pasted, " ".join(words)]


async def test_the_longest_messages_search_like_any_other(
    embedder: CachingEmbedder, redis_url: str
) -> None:
    """A message as long as the API accepts gives BM25 hits, scored as the reference does,
    alone and as the history of a follow-up."""
    index = await open_redis(embedder, redis_url)
    try:
        await ingest_files(collect_files([SAMPLE_CORPUS]), embedder, index)
        reference = await ReferenceBM25.of(index, embedder)
        vector = (await embedder.embed(["refunds"]))[0]
        for text in long_messages():
            assert len(text) <= Settings.model_fields["chatqna_max_message_chars"].default
            for query in (
                SearchQuery(text, vector, 10, fusion_weights=(0.0, 1.0)),
                SearchQuery(text, vector, 10, bm25_history=text, bm25_history_weight=0.3),
                SearchQuery("and then?", vector, 10, bm25_history=text, bm25_history_weight=0.3),
            ):
                results = await index.search(query)
                assert any(r.scores["bm25"] > 0 for r in results)
                reference.assert_scores(query, results)
    finally:
        await index.aclose()


async def test_a_hung_server_fails_a_search_after_redis_timeout_seconds(
    embedder: CachingEmbedder, redis_url: str, redis_stack: RedisStackProcess
) -> None:
    """`REDIS_TIMEOUT_SECONDS` reaches the store the composition root opens."""
    settings = Settings(redis_url=redis_url, redis_timeout_seconds=1.0, _env_file=None)
    index = await build_retriever(settings, embedder)
    assert redis_stack.process is not None
    try:
        await index.search(SearchQuery("refund", (await embedder.embed(["refund"]))[0], 4))
        redis_stack.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(IndexUnavailable):
                await index.search(SearchQuery("refund", np.ones(embedder.dimension), 4))
            assert time.monotonic() - started < 2.5
        finally:
            redis_stack.process.send_signal(signal.SIGCONT)
    finally:
        await index.aclose()


async def wait_until(url: str, ready: str, *, timeout: float = 30.0) -> None:
    """Poll until `ready` ("indexed" or "rewritten") holds on the server at `url`."""
    async with aioredis.Redis.from_url(url, protocol=2, decode_responses=True) as client:
        deadline = time.monotonic() + timeout
        while True:
            if ready == "indexed":
                info = await client.execute_command("FT.INFO", "rag-redis")
                done = dict(zip(info[::2], info[1::2], strict=True))["indexing"] == 0
            else:
                state = await client.info("persistence")
                done = not state["aof_rewrite_in_progress"] and not state["aof_rewrite_scheduled"]
            if done:
                return
            assert time.monotonic() < deadline, f"not {ready} after {timeout} s"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("rewrite", [True, False], ids=["aof-rewritten", "aof-log-only"])
async def test_data_survives_a_restart(
    embedder: CachingEmbedder, tmp_path: Path, rewrite: bool
) -> None:
    """Sources, passages and dense search come back exactly after a restart.

    Hybrid search comes back exactly too once the server has rewritten its AOF after the
    index was created (as Redis does by itself as the AOF grows). Before that, the restart
    replays `FT.CREATE`, whose post-load scan indexes every replayed passage a second time:
    RediSearch's BM25 statistics then count each passage twice and hybrid ranks shift a
    little (on these questions the best passage stays first for 7 of 8, and 95% of the top 5
    stay).
    """
    probes = [SearchQuery(q, (await embedder.embed([q]))[0], 5) for q in QUESTIONS]
    dense = [SearchQuery(p.text, p.embedding, 5, hybrid=False) for p in probes]
    hnsw = VectorIndexParams(ef_runtime=200)  # exhaustive on this corpus: results repeat
    with redis_stack_server(tmp_path / "redis", appendonly=True) as server:

        async def open_index() -> RedisHybridIndex:
            return await RedisHybridIndex.open(
                server.url, embedder_name=embedder.name, dimension=384, vector=hnsw
            )

        index = await open_index()
        if rewrite:
            await index.client.bgrewriteaof()
            await wait_until(server.url, "rewritten")
        await ingest_files(collect_files([SAMPLE_CORPUS]), embedder, index)
        sources = await index.list_sources()
        before_dense = [await index.search(p) for p in dense]
        before = [await index.search(p) for p in probes]
        await index.aclose()
        server.stop()
        server.start()  # waits while the server answers LOADING
        reopened = await open_index()
        assert await reopened.list_sources() == sources
        assert [await reopened.search(p) for p in dense] == before_dense
        await wait_until(server.url, "indexed")
        after = [await reopened.search(p) for p in probes]
        if rewrite:
            assert after == before
        else:
            # How many passages get indexed twice depends on timing: bound the shift loosely.
            best = sum(ids(a)[0] == ids(b)[0] for a, b in zip(after, before, strict=True))
            assert best >= len(QUESTIONS) - 1  # measured: 7 of 8
            kept = sum(len(set(ids(a)) & set(ids(b))) for a, b in zip(after, before, strict=True))
            assert kept >= 0.75 * 5 * len(QUESTIONS)  # measured: 38 of 40
        described = await reopened.describe()
        assert described["chunks"] == sum(s.chunks for s in sources)
        assert described["indexing"] is False
        await reopened.aclose()


async def test_unchanged_chunks_are_not_rewritten(
    embedder: CachingEmbedder, redis_url: str
) -> None:
    index = await open_redis(embedder, redis_url)
    files = collect_files([SAMPLE_CORPUS])
    await ingest_files(files, embedder, index)
    probe = SearchQuery(QUESTIONS[0], (await embedder.embed([QUESTIONS[0]]))[0], 5)
    before = await index.search(probe)
    async with aioredis.Redis.from_url(redis_url, protocol=2, decode_responses=True) as client:
        info = await client.execute_command("FT.INFO", "rag-redis")
        max_doc_id = dict(zip(info[::2], info[1::2], strict=True))["max_doc_id"]
        await ingest_files(files, embedder, index, force=True)
        info = await client.execute_command("FT.INFO", "rag-redis")
        assert dict(zip(info[::2], info[1::2], strict=True))["max_doc_id"] == max_doc_id
    assert await index.search(probe) == before
    await index.aclose()


async def test_list_sources_reads_no_chunk(redis_url: str) -> None:
    dimension, sources, per_source = 16, 20, 100
    rng = np.random.default_rng(7)
    index = await RedisHybridIndex.open(
        redis_url, embedder_name="random-16", dimension=dimension, vector=EXACT
    )
    batches = []
    for s in range(sources):
        name = f"docs/source {s:02d}.md"
        chunks = [
            Chunk(chunk_id_for(name, i), f"passage {i} of {name}", name, name, i)
            for i in range(per_source)
        ]
        vectors = rng.standard_normal((per_source, dimension)).astype(np.float32)
        batches.append(SourceBatch(name, chunks, vectors, f"hash-{s}"))
    await index.replace_sources(batches)
    client = aioredis.Redis.from_url(redis_url, protocol=2, decode_responses=True)
    await client.config_resetstat()
    listed = await index.list_sources()
    stats = await client.info("commandstats")
    await client.aclose()
    await index.aclose()
    assert [(s.source, s.chunks, s.content_hash) for s in listed] == [
        (f"docs/source {s:02d}.md", per_source, f"hash-{s}") for s in range(sources)
    ]
    called = {name.removeprefix("cmdstat_").lower(): v["calls"] for name, v in stats.items()}
    called.pop("config|resetstat", None)
    assert called == {"smembers": 1, "hmget": sources}, called


async def test_open_refuses_another_embedder(embedder: CachingEmbedder, redis_url: str) -> None:
    first = await open_redis(embedder, redis_url)
    await first.aclose()
    for name, dimension in [("other-model", 384), (embedder.name, 128)]:
        with pytest.raises(IndexUnavailable) as caught:
            await RedisHybridIndex.open(redis_url, embedder_name=name, dimension=dimension)
        assert embedder.name in caught.value.message and "384" in caught.value.message
    # Without the meta hash, the index's own vector field still gives the dimension away.
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.delete("rag-redis:meta")
    with pytest.raises(IndexUnavailable, match="384"):
        await RedisHybridIndex.open(redis_url, embedder_name=embedder.name, dimension=128)
    reopened = await RedisHybridIndex.open(
        redis_url, embedder_name=embedder.name, dimension=384, vector=EXACT
    )
    assert (await reopened.describe())["kind"] == "redis"
    await reopened.aclose()


async def test_open_refuses_an_index_of_another_format(
    embedder: CachingEmbedder, redis_url: str
) -> None:
    """An index whose meta records another layout format, or whose fields are not this
    version's (its meta gone), is refused with the way out rather than searched."""
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.execute_command(
            "FT.CREATE", "rag-redis", "ON", "HASH", "PREFIX", 1, "rag-redis:chunk:",
            "STOPWORDS", 0, "SCHEMA", "content", "TEXT", "NOSTEM",
            "embedding", "VECTOR", "FLAT", 6, "TYPE", "FLOAT32", "DIM", 384,
            "DISTANCE_METRIC", "COSINE",
        )  # fmt: skip
        client.hset("rag-redis:meta", mapping={"embedder": embedder.name, "dimension": 384})
    with pytest.raises(IndexUnavailable, match=r"format none;.*FT\.DROPINDEX rag-redis DD"):
        await open_redis(embedder, redis_url)
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.hset("rag-redis:meta", "format", "2")
    with pytest.raises(IndexUnavailable, match=r"has layout format 2; .*needs layout format 3"):
        await open_redis(embedder, redis_url)
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.delete("rag-redis:meta")
    with pytest.raises(IndexUnavailable, match="has no `terms` field"):
        await open_redis(embedder, redis_url)


def create_index_without_digest(client: Any, name: str, prefix: str, dimension: int) -> None:
    """An index of this version's fields but `digest`, which it does not hold."""
    client.execute_command(
        "FT.CREATE", name, "ON", "HASH", "PREFIX", 1, prefix, "STOPWORDS", 0, "SCHEMA",
        "terms", "TEXT", "NOSTEM", "chunk_id", "TAG", "source", "TAG",
        "chunk_index", "NUMERIC", "embedding", "VECTOR", "FLAT", 6, "TYPE", "FLOAT32",
        "DIM", dimension, "DISTANCE_METRIC", "COSINE",
    )  # fmt: skip


def some_passages(dimension: int, count: int = 12) -> SourceBatch:
    rng = np.random.default_rng(5)
    chunks = [Chunk(f"c{i:03d}", f"passage {i} about refunds", "a.md", "", i) for i in range(count)]
    vectors = rng.standard_normal((count, dimension)).astype(np.float32)
    return SourceBatch("a.md", chunks, vectors, "h")


async def test_an_index_without_a_sortable_digest_is_refused_until_dropped(
    embedder: CachingEmbedder, redis_url: str
) -> None:
    """An index that does not hold `digest` (which a search on a cluster node reads from the
    index alone) is refused, its meta's format or none; once it is dropped, the next start
    builds this version's index over the passages stored."""
    batch = some_passages(embedder.dimension)
    index = await open_redis(embedder, redis_url)
    await index.replace_sources([batch])
    await index.aclose()
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.execute_command("FT.DROPINDEX", "rag-redis")  # its passages stay
        create_index_without_digest(client, "rag-redis", "rag-redis:chunk:", embedder.dimension)
    way_out = r"has no sortable `digest` field; .*FT\.DROPINDEX rag-redis DD.*delete rag-redis:meta"
    with pytest.raises(IndexUnavailable, match=way_out):
        await open_redis(embedder, redis_url)
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.delete("rag-redis:meta")
    with pytest.raises(IndexUnavailable, match=way_out):  # the index's fields are checked
        await open_redis(embedder, redis_url)
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.execute_command("FT.DROPINDEX", "rag-redis")
    index = await open_redis(embedder, redis_url)
    try:
        assert (await index.describe())["chunks"] == len(batch.chunks)
        results = await index.search(SearchQuery("refunds", batch.embeddings[3], 4))
        assert results[0].chunk == batch.chunks[3] and results[0].scores["bm25"] > 0
    finally:
        await index.aclose()


async def test_writes_wait_for_the_initial_scan(embedder: CachingEmbedder, redis_url: str) -> None:
    """`FT.CREATE` scans the existing keys in the background; a passage written meanwhile is
    indexed twice and skews BM25 for good. Opening waits for the scan to end."""
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        pipe = client.pipeline(transaction=False)
        for i in range(50_000):
            pipe.hset(f"unrelated:{i}", "field", "value")
        pipe.execute()
    rng = np.random.default_rng(3)
    chunks = [Chunk(f"c{i:03d}", f"passage {i} about refunds", "a.md", "", i) for i in range(300)]
    vectors = rng.standard_normal((len(chunks), embedder.dimension)).astype(np.float32)
    index = await open_redis(embedder, redis_url)
    await index.replace_sources([SourceBatch("a.md", chunks, vectors, "h")])
    await asyncio.sleep(0.5)  # time for a scan still running to index them again
    async with aioredis.Redis.from_url(redis_url, protocol=2, decode_responses=True) as client:
        info = await client.execute_command("FT.INFO", "rag-redis")
    fields = dict(zip(info[::2], info[1::2], strict=True))
    assert int(fields["num_docs"]) == len(chunks)
    assert int(fields["max_doc_id"]) == len(chunks)  # each passage indexed once
    await index.aclose()


async def test_unreachable_server_is_index_unavailable(embedder: CachingEmbedder) -> None:
    from tests.integration.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}"
    with pytest.raises(IndexUnavailable, match=r"127\.0\.0\.1"):
        await RedisHybridIndex.open(url, embedder_name=embedder.name, dimension=384)


# --- one node through faults ---------------------------------------------------------------
@pytest.mark.parametrize("first", ["search", "describe"])
async def test_a_dropped_index_is_built_again(
    embedder: CachingEmbedder, redis_url: str, first: str
) -> None:
    """`FT.DROPINDEX` keeps the passages: a search or `describe()` builds the index again
    over them instead of failing until the process restarts."""
    index = await open_redis(embedder, redis_url)
    try:
        await ingest_files(collect_files([SAMPLE_CORPUS]), embedder, index)
        chunks = (await index.describe())["chunks"]
        before = await ask(index, embedder, QUESTIONS[0])
        with redis.Redis.from_url(redis_url, protocol=2) as client:
            client.execute_command("FT.DROPINDEX", "rag-redis")
        if first == "describe":
            assert (await index.describe())["chunks"] == chunks
        assert await ask(index, embedder, QUESTIONS[0]) == before
        assert (await index.describe())["chunks"] == chunks
    finally:
        await index.aclose()


async def test_an_ingest_after_flushall_builds_the_index_again(
    embedder: CachingEmbedder, redis_url: str
) -> None:
    """Everything gone (`FLUSHALL`, or a restart without persistence): an ingest builds the
    index (and its meta) before it writes, so what it writes is searchable."""
    index = await open_redis(embedder, redis_url)
    try:
        files = collect_files([SAMPLE_CORPUS])
        await ingest_files(files, embedder, index)
        before = await ask(index, embedder, QUESTIONS[0])
        with redis.Redis.from_url(redis_url, protocol=2) as client:
            client.flushall()
        await ingest_files(files, embedder, index, force=True)
        with redis.Redis.from_url(redis_url, protocol=2) as client:
            assert client.execute_command("FT._LIST") == [b"rag-redis"]
            assert client.hget("rag-redis:meta", "embedder") == embedder.name.encode()
        assert await ask(index, embedder, QUESTIONS[0]) == before
    finally:
        await index.aclose()


async def concurrent_searches(index: RedisHybridIndex, count: int) -> list[Any]:
    query = SearchQuery("refund", np.ones(384, dtype=np.float32), 4)
    return await asyncio.gather(
        *(index.search(query) for _ in range(count)), return_exceptions=True
    )


async def test_searches_beyond_the_pool_wait_for_a_connection(
    embedder: CachingEmbedder, redis_url: str
) -> None:
    """While the server is paused, 150 searches are in flight at once: none fails with
    "Too many connections" (redis-py's default pool caps at 100), and a pool of 4 makes
    20 searches wait for a connection rather than fail."""
    index = await open_redis(embedder, redis_url)
    small = await RedisHybridIndex.open(
        redis_url, embedder_name=embedder.name, dimension=384, vector=EXACT, max_connections=4
    )
    try:
        async with aioredis.Redis.from_url(redis_url, protocol=2) as client:
            await client.execute_command("CLIENT", "PAUSE", 300, "ALL")
            outcomes = await concurrent_searches(index, 150)
            assert [o for o in outcomes if isinstance(o, BaseException)] == []
            clients = int((await client.info("clients"))["connected_clients"])
            await client.execute_command("CLIENT", "PAUSE", 300, "ALL")
            outcomes = await concurrent_searches(small, 20)
            assert [o for o in outcomes if isinstance(o, BaseException)] == []
            added = int((await client.info("clients"))["connected_clients"]) - clients
        assert added <= 4
    finally:
        await index.aclose()
        await small.aclose()


async def test_a_burst_of_searches_after_a_restart_succeeds(
    embedder: CachingEmbedder, redis_url: str, redis_stack: RedisStackProcess
) -> None:
    """Every pooled connection is closed by a restart: each search retries once, at once,
    on a new connection (and builds the index again: the server kept no data)."""
    index = await open_redis(embedder, redis_url)
    try:
        assert [o for o in await concurrent_searches(index, 20) if o != []] == []
        redis_stack.stop()
        redis_stack.start()
        outcomes = await concurrent_searches(index, 20)
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
    finally:
        await index.aclose()


async def test_open_refuses_a_server_that_evicts(embedder: CachingEmbedder, redis_url: str) -> None:
    """With an evicting `maxmemory-policy`, Redis would drop passages silently: refused."""
    with redis.Redis.from_url(redis_url, protocol=2) as client:
        client.config_set("maxmemory-policy", "allkeys-lru")
        try:
            with pytest.raises(EvictingIndexServer, match="noeviction"):
                await open_redis(embedder, redis_url)
        finally:
            client.config_set("maxmemory-policy", "noeviction")
