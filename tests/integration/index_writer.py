"""A process that writes to an embedded index until it is killed (for the crash test).

    python -m tests.integration.index_writer <index dir> <first version>

Every request replaces all `SOURCES` sources with a new version `v`: each source gets
`chunk_count(v)` chunks whose text names the version (`ver<v>`), and the content hash
`v<v>`. It prints `begin <v>` before a request and `done <v>` once it has returned, flushing
each line, so the parent knows which versions were committed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

from chatqna.backends.protocols import SourceBatch
from chatqna.documents import Chunk, chunk_id_for
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex

DIMENSION = 16
EMBEDDER = "crash-test-16"
SOURCES = 8


def chunk_count(version: int) -> int:
    return 150 + version % 7 * 20


def batches(version: int) -> list[SourceBatch]:
    rng = np.random.default_rng(version)
    result = []
    for number in range(SOURCES):
        source = f"doc-{number}.md"
        count = chunk_count(version)
        chunks = [
            Chunk(
                chunk_id_for(source, i),
                f"ver{version} src{number} passage {i} words to index here",
                source,
                f"Doc {number}",
                i,
            )
            for i in range(count)
        ]
        vectors = rng.standard_normal((count, DIMENSION)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        result.append(SourceBatch(source, chunks, vectors, f"v{version}"))
    return result


async def main(directory: Path, first: int) -> None:
    index = await EmbeddedHybridIndex.open(directory, embedder_name=EMBEDDER, dimension=DIMENSION)
    print("open", flush=True)
    version = first
    while True:
        prepared = batches(version)
        print(f"begin {version}", flush=True)
        await index.replace_sources(prepared)
        print(f"done {version}", flush=True)
        version += 1


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
