"""How much memory and disk Redis Stack needs per chunk, FLAT vs HNSW, to size a node.

    .venv/bin/python benchmarks/redis_memory.py [--sizes 50000,200000]

For each vector algorithm (FLAT, and HNSW with the service's default `REDIS_HNSW_*`) and each
corpus size, starts a fresh loopback Redis Stack (`tests/integration/redis_server.py`, the
binaries of `scripts/redis-stack`), creates the service's index with `RedisHybridIndex`,
reads `INFO memory` once the index exists and is empty, ingests the synthetic corpus of
`index_scale.py` (chunks of 45-75 words, 60 on average, random unit 384-d float32 vectors,
sources of 100 chunks) through `replace_sources` as dataprep does, and reads `INFO memory`,
`FT.INFO` and the size of an RDB snapshot (`BGSAVE`) afterwards.

Per million chunks is extrapolated two ways: the bytes per chunk at the largest size, and
the slope between the two sizes (what one more chunk costs, whatever the fixed part). Both
are printed and written to `results/redis_memory.json`. The vectors being random does not
change FLAT's memory (a flat array) and changes HNSW's little (the graph has about M links per
node at every level, whatever the data). Real text may be longer or shorter than 60 words:
the `used_memory` minus the vector index is roughly proportional to the text's length.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams  # noqa: E402
from tests.integration.redis_server import redis_stack_server  # noqa: E402

# The corpus and parameters of index_scale.py, so the two benchmarks measure the same chunks.
_spec = importlib.util.spec_from_file_location("index_scale", HERE / "index_scale.py")
assert _spec is not None and _spec.loader is not None
index_scale = importlib.util.module_from_spec(_spec)
sys.modules["index_scale"] = index_scale  # its dataclasses look their module up
_spec.loader.exec_module(index_scale)

MIB = 1024 * 1024
FT_INFO_SIZES = (
    "vector_index_sz_mb",
    "inverted_sz_mb",
    "offset_vectors_sz_mb",
    "doc_table_size_mb",
    "sortable_values_size_mb",
    "key_table_size_mb",
    "text_overhead_sz_mb",
    "tag_overhead_sz_mb",
    "total_index_memory_sz_mb",
)
STARTED = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


def ft_info_sizes(info: list[Any]) -> dict[str, float]:
    fields = {
        (k.decode() if isinstance(k, bytes) else str(k)): v
        for k, v in zip(info[::2], info[1::2], strict=False)
    }
    found = {}
    for name in FT_INFO_SIZES:
        if name in fields:
            value = fields[name]
            found[name] = round(float(value.decode() if isinstance(value, bytes) else value), 3)
    return found


async def snapshot(client: Any, rdb: Path) -> int:
    """Size of an RDB snapshot of the database: BGSAVE, then wait for it (a large HNSW
    index takes longer to serialise than the client's read timeout)."""
    await client.execute_command("BGSAVE")  # type: ignore[no-untyped-call]
    while True:
        await asyncio.sleep(0.5)
        persistence = await client.info("persistence")
        if not int(persistence["rdb_bgsave_in_progress"]):
            break
    if persistence["rdb_last_bgsave_status"] != "ok":
        raise RuntimeError(f"BGSAVE failed: {persistence}")
    return rdb.stat().st_size


async def measure(corpus: Any, vector: VectorIndexParams, root: Path, batch: int) -> dict[str, Any]:
    size = len(corpus.chunks)
    label = f"{vector.algorithm} {size}"
    directory = root / f"redis-{vector.algorithm}-{size}"
    with redis_stack_server(directory) as server:
        index = await RedisHybridIndex.open(
            server.url,
            embedder_name=index_scale.EMBEDDER_NAME,
            dimension=index_scale.DIMENSION,
            vector=vector,
        )
        try:
            client = index.client
            empty = await client.info("memory")
            calls = corpus.batches(batch)
            progress(f"{label}: ingest in {len(calls)} calls")
            seconds = await index_scale.ingest(index, calls, label)
            await index_scale.until_indexed(index, label, size)
            full = await client.info("memory")
            info = await client.execute_command("FT.INFO", index.index_name)  # type: ignore[no-untyped-call]
            keys = await client.dbsize()
            progress(f"{label}: {seconds:.1f} s; BGSAVE")
            rdb_bytes = await snapshot(client, directory / "dump.rdb")
        finally:
            await index.aclose()
    used = int(full["used_memory"]) - int(empty["used_memory"])
    return {
        "algorithm": vector.algorithm,
        "vector_params": vars(vector),
        "chunks": size,
        "keys": int(keys),
        "ingest_s": round(seconds, 1),
        "used_memory_empty_bytes": int(empty["used_memory"]),
        "used_memory_bytes": int(full["used_memory"]),
        "used_memory_dataset_bytes": int(full["used_memory_dataset"]),
        "used_memory_rss_bytes": int(full["used_memory_rss"]),
        "used_memory_added_bytes": used,
        "bytes_per_chunk": round(used / size),
        "ft_info_mb": ft_info_sizes(info),
        "rdb_bytes": rdb_bytes,
        "rdb_bytes_per_chunk": round(rdb_bytes / size),
    }


def per_million(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """GiB per million chunks: at the largest size, and from the slope between two sizes."""
    ordered = sorted(rows, key=lambda r: r["chunks"])
    small, large = ordered[0], ordered[-1]
    found: dict[str, Any] = {
        "at_largest_gib": round(large["bytes_per_chunk"] * 1e6 / 1024**3, 2),
        "rss_at_largest_gib": round(
            large["used_memory_rss_bytes"] / large["chunks"] * 1e6 / 1024**3, 2
        ),
        "rdb_at_largest_gib": round(large["rdb_bytes_per_chunk"] * 1e6 / 1024**3, 2),
        "vector_index_at_largest_gib": round(
            large["ft_info_mb"].get("vector_index_sz_mb", 0)
            * MIB
            / large["chunks"]
            * 1e6
            / 1024**3,
            2,
        ),
    }
    if large["chunks"] > small["chunks"]:
        slope = (large["used_memory_added_bytes"] - small["used_memory_added_bytes"]) / (
            large["chunks"] - small["chunks"]
        )
        found["slope_gib"] = round(slope * 1e6 / 1024**3, 2)
    return found


def print_table(rows: list[dict[str, Any]], extrapolated: dict[str, dict[str, Any]]) -> None:
    print()
    print(f"{'algorithm':<9} {'chunks':>8} {'ingest s':>9} {'used MiB':>9} {'B/chunk':>8} "
          f"{'vector MiB':>10} {'text idx MiB':>12} {'RSS MiB':>8} {'RDB MiB':>8}")  # fmt: skip
    for row in rows:
        ft = row["ft_info_mb"]
        text = ft.get("inverted_sz_mb", 0) + ft.get("offset_vectors_sz_mb", 0)
        print(
            f"{row['algorithm']:<9} {row['chunks']:>8} {row['ingest_s']:>9.1f} "
            f"{row['used_memory_added_bytes'] / MIB:>9.0f} {row['bytes_per_chunk']:>8} "
            f"{ft.get('vector_index_sz_mb', 0):>10.0f} {text:>12.0f} "
            f"{row['used_memory_rss_bytes'] / MIB:>8.0f} {row['rdb_bytes'] / MIB:>8.0f}"
        )
    print()
    print("GiB per million chunks (used_memory added by the chunks; RSS; RDB on disk):")
    for algorithm, found in extrapolated.items():
        print(f"  {algorithm}: {found}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="50000,200000")
    parser.add_argument("--batch", type=int, default=1000, help="chunks per replace_sources")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--algorithms", default="FLAT,HNSW")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "redis_memory.json")
    args = parser.parse_args()
    start_run()
    sizes = [int(s) for s in args.sizes.split(",")]
    vectors = {"FLAT": VectorIndexParams(algorithm="FLAT"), "HNSW": index_scale.hnsw_defaults()}
    words = index_scale.vocabulary(__import__("numpy").random.default_rng(args.seed))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="redis-memory-") as tmp:
        for size in sizes:
            corpus = index_scale.build_corpus(size, words, args.seed)
            for algorithm in args.algorithms.split(","):
                rows.append(await measure(corpus, vectors[algorithm], Path(tmp), args.batch))
                progress(f"  {json.dumps(rows[-1])}")
            del corpus
    extrapolated = {
        algorithm: per_million([r for r in rows if r["algorithm"] == algorithm])
        for algorithm in args.algorithms.split(",")
    }
    print_table(rows, extrapolated)
    result = {
        "sizes": sizes,
        "chunks_per_call": args.batch,
        "seed": args.seed,
        "corpus": {
            "words_per_chunk": list(index_scale.WORDS_PER_CHUNK),
            "chunks_per_source": index_scale.CHUNKS_PER_SOURCE,
            "dimension": index_scale.DIMENSION,
            "vocabulary": index_scale.VOCABULARY_SIZE,
        },
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "rows": rows,
        "per_million_chunks": extrapolated,
        "total_run_s": round(time.perf_counter() - STARTED, 1),
    }
    write_result(args.out, result)
    progress(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
