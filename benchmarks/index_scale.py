"""How the retrievers scale: ingest throughput and hybrid query latency, embedded vs Redis.

    .venv/bin/python benchmarks/index_scale.py --configuration 10k_100k --graph
    .venv/bin/python benchmarks/index_scale.py --configuration 1m --sizes 1000000 --no-redis

For each corpus size, builds a deterministic synthetic corpus and ingests it, through
`replace_sources` as dataprep does, into the embedded index (`EmbeddedHybridIndex`: SQLite,
tantivy and an in-memory matrix, in a temporary directory) and into Redis Stack
(`RedisHybridIndex`, a fresh loopback server from `tests/integration/redis_server.py` per
size and algorithm; `--no-redis` skips it) with an HNSW vector field (the
service's default `REDIS_HNSW_*` settings) and with a FLAT one. Then it times `--queries`
searches (k=10) per index, hybrid (KNN + BM25 + RRF) and dense only, and prints ingest
seconds, chunks/s and latency percentiles side by side. Writes `results/index_scale.json`,
under `configurations` as the named run (`--configuration`) beside the others.

At `--cluster-min` chunks and above (100k) the same corpus also goes into a Redis Cluster
of 3 primaries and 3 replicas on loopback (`RedisClusterHybridIndex`), beside the single
node, in the same run: each primary indexes a third, each replica its primary's third too,
and every search goes to the three primaries concurrently and is merged in the client.
`--indexes redis,cluster --sizes 100000 --configuration cluster_100k` runs
just the Redis rows. On a machine with fewer cores than processes (six servers and the
client on 2 cores here) the primaries' work cannot run in parallel, so these rows show
what the fan-out costs, not what sharding gains on machines of their own.

The corpus: chunks of 45-75 words (60 on average) drawn from a fixed vocabulary of 4,000
pseudo-words with a Zipf (s=1) distribution, so BM25 postings have a natural-language shape
(a few terms in almost every chunk, a long tail of rare ones), grouped into sources of 100
chunks. Vectors are random unit float32 vectors of 384 dimensions (the width of
all-MiniLM-L6-v2): what exact search (embedded, FLAT) costs does not depend on what the
vectors mean, so no embedder runs and none is timed. HNSW's graph does depend on the data,
and random vectors are a near worst case for its recall (no cluster structure): the dense
recall@k against exact search saved in the JSON checks that every index holds the whole
corpus (1.0 for the exact ones) and is not a measure of HNSW's recall on real embeddings.
Queries are 4 words drawn from the same distribution plus a random unit vector.

Ingest is timed two ways for the embedded index: once with all chunks in one
`replace_sources` call (what one large dataprep request does) and once in calls of `--batch`
chunks (many smaller requests; skipped above `--embedded-batched-max`). What one more
request of `--batch` chunks costs once the index holds the rest of the corpus is timed too,
at every size, and printed under the table, with the process's resident memory and the
index directory's size.
Redis is timed in calls of `--batch` chunks only: it writes chunk by chunk (pipelines of
500) whatever the call size.
Searches on the embedded index include its `asyncio.to_thread` hop; Redis searches include
the loopback round trip. Everything (client, Redis server) shares this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import sqlite3
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from chatqna.backends.protocols import SearchQuery, SourceBatch  # noqa: E402
from chatqna.documents import Chunk, chunk_id_for  # noqa: E402
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex  # noqa: E402
from chatqna.retrieval.query import STOP_WORDS  # noqa: E402
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex  # noqa: E402
from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams  # noqa: E402
from chatqna.settings import Settings  # noqa: E402
from tests.integration.redis_server import redis_cluster, redis_stack_server  # noqa: E402

DIMENSION = 384
VOCABULARY_SIZE = 4000
ZIPF_EXPONENT = 1.0
WORDS_PER_CHUNK = (45, 75)  # inclusive range; 60 on average
CHUNKS_PER_SOURCE = 100
QUERY_WORDS = 4
WARMUP_QUERIES = 10
EMBEDDER_NAME = "synthetic-random-unit-384"
STARTED = time.perf_counter()
Queries = list[tuple[str, np.ndarray]]


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


def hnsw_defaults() -> VectorIndexParams:
    """HNSW with the service's defaults (`REDIS_HNSW_M`, `..._EF_CONSTRUCTION`, `..._RUNTIME`)."""
    fields = Settings.model_fields
    return VectorIndexParams(
        algorithm="HNSW",
        m=int(fields["redis_hnsw_m"].default),
        ef_construction=int(fields["redis_hnsw_ef_construction"].default),
        ef_runtime=int(fields["redis_hnsw_ef_runtime"].default),
    )


# --- the synthetic corpus -------------------------------------------------------------------
@dataclass(frozen=True)
class Corpus:
    chunks: list[Chunk]
    matrix: np.ndarray  # (n, DIMENSION) float32, unit rows
    sources: list[tuple[str, int, int]]  # (source, first row, end row)

    def batches(self, chunks_per_call: int) -> list[list[SourceBatch]]:
        """`replace_sources` arguments of about `chunks_per_call` chunks (whole sources)."""
        per_call = max(1, chunks_per_call // CHUNKS_PER_SOURCE)
        batches = [
            SourceBatch(source, self.chunks[first:end], self.matrix[first:end], f"hash-{source}")
            for source, first, end in self.sources
        ]
        return [batches[i : i + per_call] for i in range(0, len(batches), per_call)]


def vocabulary(rng: np.random.Generator) -> np.ndarray:
    """`VOCABULARY_SIZE` distinct lower-case pseudo-words of 3-10 letters, no stop words."""
    letters = np.array(list(string.ascii_lowercase))
    words: dict[str, None] = {}
    while len(words) < VOCABULARY_SIZE:
        word = "".join(rng.choice(letters, size=int(rng.integers(3, 11))))
        if word not in STOP_WORDS:
            words[word] = None
    return np.array(list(words))


def zipf_weights() -> np.ndarray:
    weights = 1.0 / np.arange(1, VOCABULARY_SIZE + 1) ** ZIPF_EXPONENT
    return weights / weights.sum()


def unit_vectors(rng: np.random.Generator, count: int) -> np.ndarray:
    matrix = rng.standard_normal((count, DIMENSION), dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix


def build_corpus(size: int, words: np.ndarray, seed: int) -> Corpus:
    rng = np.random.default_rng([seed, size])
    lengths = rng.integers(WORDS_PER_CHUNK[0], WORDS_PER_CHUNK[1] + 1, size=size)
    draws = rng.choice(len(words), size=(size, WORDS_PER_CHUNK[1]), p=zipf_weights())
    chunks: list[Chunk] = []
    sources: list[tuple[str, int, int]] = []
    for first in range(0, size, CHUNKS_PER_SOURCE):
        end = min(first + CHUNKS_PER_SOURCE, size)
        source = f"synthetic/doc-{first // CHUNKS_PER_SOURCE:05d}.md"
        title = f"Synthetic document {first // CHUNKS_PER_SOURCE}"
        for row in range(first, end):
            text = " ".join(words[draws[row, : lengths[row]]]) + "."
            index = row - first
            chunks.append(Chunk(chunk_id_for(source, index), text, source, title, index))
        sources.append((source, first, end))
    return Corpus(chunks, unit_vectors(rng, size), sources)


def build_queries(count: int, words: np.ndarray, seed: int) -> Queries:
    rng = np.random.default_rng([seed, 1])
    draws = rng.choice(len(words), size=(count, QUERY_WORDS), p=zipf_weights())
    vectors = unit_vectors(rng, count)
    return [(" ".join(words[row]), vectors[i]) for i, row in enumerate(draws)]


# --- measurements -------------------------------------------------------------------------
def percentile(values: Sequence[float], fraction: float) -> float:
    return sorted(values)[int(fraction * (len(values) - 1))]


async def ingest(index: Any, calls: list[list[SourceBatch]], label: str) -> float:
    started = time.perf_counter()
    for number, batches in enumerate(calls, start=1):
        await index.replace_sources(batches)
        if number % 20 == 0 and number < len(calls):
            progress(f"  {label}: {number}/{len(calls)} calls")
    return time.perf_counter() - started


async def until_indexed(index: Any, label: str, size: int) -> float:
    """Wait while a Redis index reports `indexing` after the writes, then check it holds all
    `size` chunks; returns the seconds waited (none expected: the index existed before)."""
    started = time.perf_counter()
    description = await index.describe()
    while description["indexing"]:
        await asyncio.sleep(0.1)
        description = await index.describe()
    if description["chunks"] != size:
        raise RuntimeError(f"{label}: {description['chunks']} chunks indexed of {size}")
    return time.perf_counter() - started


async def time_searches(
    index: Any, queries: Queries, warmup: Queries, k: int, hybrid: bool
) -> tuple[list[float], list[list[str]]]:
    for text, vector in warmup:  # untimed: first-call costs, caches
        await index.search(SearchQuery(text, vector, k, hybrid))
    latencies: list[float] = []
    ids: list[list[str]] = []
    for text, vector in queries:
        started = time.perf_counter()
        hits = await index.search(SearchQuery(text, vector, k, hybrid))
        latencies.append((time.perf_counter() - started) * 1000)
        ids.append([hit.chunk.id for hit in hits])
    return latencies, ids


def exact_top_k(corpus: Corpus, queries: Queries, k: int) -> list[set[str]]:
    vectors = np.stack([vector for _, vector in queries])
    similarities = vectors @ corpus.matrix.T
    top = np.argsort(-similarities, axis=1, kind="stable")[:, :k]
    return [{corpus.chunks[int(i)].id for i in row} for row in top]


async def measure_searches(
    index: Any, queries: Queries, warmup: Queries, k: int, exact: list[set[str]]
) -> dict[str, Any]:
    hybrid, hybrid_ids = await time_searches(index, queries, warmup, k, hybrid=True)
    dense, dense_ids = await time_searches(index, queries, warmup, k, hybrid=False)
    recall = statistics.fmean(len(exact[i] & set(ids)) / k for i, ids in enumerate(dense_ids))
    return {
        "hybrid_p50_ms": round(statistics.median(hybrid), 3),
        "hybrid_p95_ms": round(percentile(hybrid, 0.95), 3),
        "hybrid_mean_ms": round(statistics.fmean(hybrid), 3),
        "dense_p50_ms": round(statistics.median(dense), 3),
        "dense_p95_ms": round(percentile(dense, 0.95), 3),
        "dense_recall_at_k_vs_exact": round(recall, 4),
        "hybrid_results_min": min(len(ids) for ids in hybrid_ids),
    }


@dataclass(frozen=True)
class Workload:
    """The timed queries, the untimed warm-up ones, and the exact dense top k of each."""

    queries: Queries
    warmup: Queries
    exact: list[set[str]]

    async def measure(self, index: Any, k: int) -> dict[str, Any]:
        return await measure_searches(index, self.queries, self.warmup, k, self.exact)


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def resident_bytes() -> int:
    """This process's resident set size now (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def row(label: str, size: int, seconds: float, calls: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": label,
        "chunks": size,
        "ingest_calls": calls,
        "ingest_s": round(seconds, 3),
        "chunks_per_s": round(size / seconds, 1),
        **extra,
    }


async def run_embedded(
    corpus: Corpus, workload: Workload, args: argparse.Namespace, root: Path
) -> list[dict[str, Any]]:
    size = len(corpus.chunks)
    rows = []
    index = await EmbeddedHybridIndex.open(
        root / "one-call", embedder_name=EMBEDDER_NAME, dimension=DIMENSION
    )
    progress(f"embedded, {size} chunks: ingest in one call")
    seconds = await ingest(index, corpus.batches(size), "embedded one call")
    file_bytes = directory_bytes(root / "one-call")
    progress(f"embedded, {size} chunks: {seconds:.1f} s; {args.queries} queries x 2")
    searches = await workload.measure(index, args.k)
    memory = {
        "index_bytes": file_bytes,
        "process_rss_bytes": resident_bytes(),
        "vector_bytes": vector_bytes(index),
        "dense_search": index.describe_engine(),
    }
    await index.aclose()
    del index
    progress(f"embedded, {size} chunks: reopening the directory in a fresh process")
    memory.update(reopen_in_fresh_process(root / "one-call"))
    rows.append(row("embedded (1 call)", size, seconds, 1, **memory, **searches))
    if args.graph:
        rows.append(await run_embedded_graph(corpus, workload, args, root))
    if size <= args.embedded_batched_max:
        index = await EmbeddedHybridIndex.open(
            root / "batched", embedder_name=EMBEDDER_NAME, dimension=DIMENSION
        )
        calls = corpus.batches(args.batch)
        progress(f"embedded, {size} chunks: ingest in {len(calls)} calls")
        seconds = await ingest(index, calls, "embedded batched")
        progress(f"embedded, {size} chunks: {seconds:.1f} s (same index: no searches)")
        label = f"embedded ({args.batch // 1000}k/call)"
        file_bytes = directory_bytes(root / "batched")
        rows.append(row(label, size, seconds, len(calls), index_bytes=file_bytes))
        await index.aclose()
        del index
    else:
        progress(f"embedded, {size} chunks: batched ingest skipped (> --embedded-batched-max)")
    # What one more `--batch`-chunk request costs once the index is nearly full.
    *earlier, last = corpus.batches(args.batch)
    if earlier:
        index = await EmbeddedHybridIndex.open(
            root / "marginal", embedder_name=EMBEDDER_NAME, dimension=DIMENSION
        )
        extra = sum(len(b.chunks) for b in last)
        progress(f"embedded, {size} chunks: one call of {extra} into {size - extra}")
        await index.replace_sources([batch for call in earlier for batch in call])
        seconds = await ingest(index, [last], "embedded last call")
        rows.append(
            {
                "index": "embedded (one more call)",
                "chunks": size,
                "call_chunks": extra,
                "ingest_s": round(seconds, 3),
                "chunks_per_s": round(extra / seconds, 1),
            }
        )
        await index.aclose()
        del index
    return rows


REOPEN = """
import asyncio, json, sys, time
from pathlib import Path
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
started = time.perf_counter()
index = asyncio.run(EmbeddedHybridIndex.open(Path(sys.argv[1]), embedder_name=sys.argv[2],
                                             dimension=int(sys.argv[3])))
opened = time.perf_counter() - started
status = Path("/proc/self/status").read_text().splitlines()
rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
print(json.dumps({"reopen_s": round(opened, 2), "reopen_rss_bytes": rss}))
"""


def reopen_in_fresh_process(directory: Path) -> dict[str, Any]:
    """What a restarted service pays to open this index: seconds and resident memory of a
    fresh process that opens it (and holds nothing else)."""
    opened = subprocess.run(
        [sys.executable, "-c", REOPEN, str(directory), EMBEDDER_NAME, str(DIMENSION)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=3600,
    )
    return dict(json.loads(opened.stdout.strip().splitlines()[-1]))


def vector_bytes(index: EmbeddedHybridIndex) -> int:
    """Bytes the dense leg holds in memory: float32 and int8 buffers, and the graph if any."""
    vectors = index._vectors
    graph = index._graph
    held = vectors.buffer.nbytes + vectors.codes.nbytes + vectors.scales.nbytes
    return held + (graph.memory_bytes if graph is not None else 0)


async def run_embedded_graph(
    corpus: Corpus, workload: Workload, args: argparse.Namespace, root: Path
) -> dict[str, Any]:
    """The same one-call index with the HNSW graph forced on (exact size 0), built with
    every core, timed once the build is done."""
    size = len(corpus.chunks)
    index = await EmbeddedHybridIndex.open(
        root / "graph",
        embedder_name=EMBEDDER_NAME,
        dimension=DIMENSION,
        exact_max=0,
        graph_threads=os.cpu_count() or 1,
    )
    progress(f"embedded + graph, {size} chunks: ingest in one call, then the graph build")
    seconds = await ingest(index, corpus.batches(size), "embedded + graph")
    started = time.perf_counter()
    index.wait_for_graph()
    build = time.perf_counter() - started
    progress(f"embedded + graph, {size} chunks: graph ready after {build:.0f} s more")
    searches = await workload.measure(index, args.k)
    result = row(
        "embedded + HNSW graph (1 call)",
        size,
        seconds,
        1,
        graph_build_wait_s=round(build, 1),
        process_rss_bytes=resident_bytes(),
        vector_bytes=vector_bytes(index),
        dense_search=index.describe_engine(),
        **searches,
    )
    await index.aclose()
    return result


async def run_redis(
    corpus: Corpus,
    workload: Workload,
    args: argparse.Namespace,
    root: Path,
    vector: VectorIndexParams,
    versions: dict[str, str],
) -> dict[str, Any]:
    size = len(corpus.chunks)
    label = f"redis {vector.algorithm}"
    with redis_stack_server(root / f"redis-{vector.algorithm}-{size}") as server:
        index = await RedisHybridIndex.open(
            server.url, embedder_name=EMBEDDER_NAME, dimension=DIMENSION, vector=vector
        )
        try:
            if not versions:
                versions.update(await redis_versions(index))
            calls = corpus.batches(args.batch)
            progress(f"{label}, {size} chunks: ingest in {len(calls)} calls")
            seconds = await ingest(index, calls, label)
            waited = await until_indexed(index, label, size)
            memory = await index.client.info("memory")
            progress(f"{label}, {size} chunks: {seconds:.1f} s; {args.queries} queries x 2")
            searches = await workload.measure(index, args.k)
        finally:
            await index.aclose()
    return row(
        label,
        size,
        seconds,
        len(calls),
        redis_used_memory_bytes=int(memory["used_memory"]),
        indexing_wait_s=round(waited, 3),
        vector_params=vars(vector),
        **searches,
    )


async def run_redis_cluster(
    corpus: Corpus,
    workload: Workload,
    args: argparse.Namespace,
    root: Path,
    vector: VectorIndexParams,
) -> dict[str, Any]:
    """The same as `run_redis` on a Redis Cluster of 3 primaries and 3 replicas on this
    machine: every primary indexes its third of the corpus, every replica indexes its
    primary's too, and all seven processes (six servers and this client) share its cores."""
    size = len(corpus.chunks)
    label = f"redis cluster {vector.algorithm}"
    with redis_cluster(root / f"cluster-{vector.algorithm}-{size}") as cluster:
        index = await RedisClusterHybridIndex.open(
            cluster.url, embedder_name=EMBEDDER_NAME, dimension=DIMENSION, vector=vector
        )
        try:
            calls = corpus.batches(args.batch)
            progress(f"{label}, {size} chunks: ingest in {len(calls)} calls")
            seconds = await ingest(index, calls, label)
            await until_indexed(index, label, size)
            memory = 0
            for shard in index.topology.primaries:
                info = await index.topology.client(shard.address).info("memory")
                memory += int(info["used_memory"])
            per_primary = {s.address: 0 for s in index.topology.primaries}
            for shard in index.topology.primaries:
                client = index.topology.client(shard.address)
                per_primary[shard.address] = int(await client.dbsize())
            progress(f"{label}, {size} chunks: {seconds:.1f} s; {args.queries} queries x 2")
            searches = await workload.measure(index, args.k)
        finally:
            await index.aclose()
    return row(
        label,
        size,
        seconds,
        len(calls),
        redis_used_memory_bytes=memory,
        primaries=3,
        replicas=3,
        keys_per_primary=sorted(per_primary.values()),
        vector_params=vars(vector),
        **searches,
    )


async def redis_versions(index: RedisHybridIndex) -> dict[str, str]:
    server = await index.client.info("server")
    modules = await index.client.execute_command("MODULE", "LIST")  # type: ignore[no-untyped-call]
    found = {"redis": str(server["redis_version"])}
    for module in modules:
        fields = dict(zip(module[::2], module[1::2], strict=False))
        name = fields[b"name"].decode()
        found[name] = str(fields[b"ver"])
    return found


async def run(args: argparse.Namespace) -> dict[str, Any]:
    words = vocabulary(np.random.default_rng([args.seed, 0]))
    queries = build_queries(args.queries + WARMUP_QUERIES, words, args.seed)
    warm, measured = queries[:WARMUP_QUERIES], queries[WARMUP_QUERIES:]
    rows: list[dict[str, Any]] = []
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="index-scale-", dir=args.tmp_dir) as tmp:
        for size in args.sizes:
            progress(f"building a corpus of {size} chunks")
            corpus = build_corpus(size, words, args.seed)
            exact = exact_top_k(corpus, measured, args.k)
            workload = Workload(measured, warm, exact)
            root = Path(tmp) / str(size)
            if "embedded" in args.indexes:
                rows += await run_embedded(corpus, workload, args, root)
            for vector in (hnsw_defaults(), VectorIndexParams(algorithm="FLAT")):
                if "redis" in args.indexes:
                    rows.append(await run_redis(corpus, workload, args, root, vector, versions))
                if "cluster" in args.indexes and size >= args.cluster_min:
                    rows.append(await run_redis_cluster(corpus, workload, args, root, vector))
            del corpus
    return {"rows": rows, "versions": versions, "vocabulary_sample": list(words[:10])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated chunk counts")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1000, help="chunks per replace_sources")
    parser.add_argument("--embedded-batched-max", type=int, default=100000)
    parser.add_argument("--redis", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--graph",
        action="store_true",
        help="also time the embedded index with its HNSW graph forced on (exact size 0)",
    )
    parser.add_argument("--seed", type=int, default=20240)
    parser.add_argument(
        "--indexes", default="embedded,redis,cluster", help="which of embedded,redis,cluster"
    )
    parser.add_argument(
        "--cluster-min", type=int, default=100000, help="smallest size the cluster runs at"
    )
    parser.add_argument("--tmp-dir", type=Path, help="where the indexes go (default: $TMPDIR)")
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "index_scale.json"
    )
    parser.add_argument(
        "--configuration", help="write the run as this named configuration of --output"
    )
    args = parser.parse_args()
    start_run()
    args.sizes = [int(size) for size in args.sizes.split(",")]
    args.indexes = set(args.indexes.split(","))
    if not args.redis:  # --no-redis: the embedded rows alone
        args.indexes -= {"redis", "cluster"}
    load_before = os.getloadavg()
    result = asyncio.run(run(args))
    elapsed = time.perf_counter() - STARTED
    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "tantivy": importlib.metadata.version("tantivy"),
        "numkong": importlib.metadata.version("numkong"),
        "usearch": importlib.metadata.version("usearch"),
        "sqlite": sqlite3.sqlite_version,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **{f"{name}_version": version for name, version in result["versions"].items()},
    }
    print(
        f"{args.queries} queries of {QUERY_WORDS} words + a {DIMENSION}-d vector, k={args.k}; "
        f"Python {machine['python']}, {machine['cpus']} cores; "
        f"Redis {result['versions'].get('redis', '?')} on loopback:"
    )
    print("| index | chunks | ingest s | chunks/s | hybrid p50 ms | hybrid p95 ms | dense p50 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        if "call_chunks" in r:
            continue
        timed = "hybrid_p50_ms" in r
        cells = [
            f"{r['hybrid_p50_ms']:.2f}" if timed else "—",
            f"{r['hybrid_p95_ms']:.2f}" if timed else "—",
            f"{r['dense_p50_ms']:.2f}" if timed else "—",
        ]
        label = r["index"]
        print(
            f"| {label} | {r['chunks']:,} | {r['ingest_s']:.1f} | {r['chunks_per_s']:,.0f} | "
            + " | ".join(cells)
            + " |"
        )
    for r in result["rows"]:
        if "call_chunks" in r:
            print(
                f"{r['index'].removesuffix(' (one more call)')}, one more call of "
                f"{r['call_chunks']:,} chunks into an index of "
                f"{r['chunks'] - r['call_chunks']:,}: {r['ingest_s']:.2f} s"
            )
        if "process_rss_bytes" in r and "index_bytes" in r:
            print(
                f"{r['index']}, {r['chunks']:,} chunks: index directory "
                f"{r['index_bytes'] / 2**20:,.0f} MiB, process resident "
                f"{r['process_rss_bytes'] / 2**20:,.0f} MiB (corpus included)"
            )
        if "reopen_rss_bytes" in r:
            print(
                f"{r['index']}, {r['chunks']:,} chunks: a fresh process opens it in "
                f"{r['reopen_s']:.1f} s and then holds {r['reopen_rss_bytes'] / 2**20:,.0f} MiB"
            )
        if "vector_bytes" in r:
            print(
                f"{r['index']}, {r['chunks']:,} chunks: dense leg {r['dense_search']}, "
                f"{r['vector_bytes'] / 2**20:,.0f} MiB of vectors in memory"
                + (
                    f", graph built in {r['graph_build_wait_s']:.0f} s after the ingest; "
                    f"dense recall@k vs exact {r['dense_recall_at_k_vs_exact']:.3f} "
                    "(random vectors: no guide to real embeddings)"
                    if "graph_build_wait_s" in r
                    else ""
                )
            )
    print(f"total run time {elapsed:.0f} s")
    write_result(
        args.output,
        {
            "sizes": args.sizes,
            "queries": args.queries,
            "warmup_queries": WARMUP_QUERIES,
            "k": args.k,
            "chunks_per_call": args.batch,
            "embedded_batched_max": args.embedded_batched_max,
            "indexes": sorted(args.indexes),
            "seed": args.seed,
            "corpus": {
                "vocabulary": VOCABULARY_SIZE,
                "zipf_exponent": ZIPF_EXPONENT,
                "words_per_chunk": list(WORDS_PER_CHUNK),
                "chunks_per_source": CHUNKS_PER_SOURCE,
                "dimension": DIMENSION,
                "vectors": "random unit float32 (no embedder)",
                "query_words": QUERY_WORDS,
            },
            "machine": machine,
            "total_run_s": round(elapsed, 1),
            "rows": result["rows"],
        },
        configuration=args.configuration,
    )
    print(f"written to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
