"""Reading the previous embedded index format (`index.npz`, format 1), to migrate it.

Format 1 kept everything in one NumPy archive: the embedding matrix, and a JSON blob with
the format number, the embedder's name, every chunk and every source's content hash. The
current index (`chatqna.retrieval.memory_store`) imports such a file on first open, so an
upgrade re-embeds nothing and drops nothing; the old file is then renamed, not deleted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chatqna.backends.protocols import SourceBatch
from chatqna.documents import Chunk
from chatqna.errors import IndexUnavailable

LEGACY_FILE = "index.npz"
LEGACY_FORMAT = 1
MIGRATED_SUFFIX = ".migrated"


def read_legacy(path: Path, embedder_name: str, dimension: int) -> list[SourceBatch]:
    """The sources of a format-1 index as batches, in their stored order."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
            matrix = np.asarray(archive["embeddings"], dtype=np.float32)
        chunks = [Chunk(**item) for item in meta["chunks"]]
        hashes = dict(meta.get("hashes", {}))
        version, embedder = meta.get("format"), meta.get("embedder")
        width = matrix.shape[1] if matrix.ndim == 2 else -1
    except Exception as exc:
        # A damaged file fails in many ways (zip, JSON, shapes, fields); all mean the same.
        raise IndexUnavailable(
            f"cannot read the earlier-format index at {path}: {exc!r}; move it away and "
            "rebuild with `chatqna ingest --rebuild <paths>`"
        ) from exc
    if version != LEGACY_FORMAT or len(chunks) != matrix.shape[0]:
        raise IndexUnavailable(
            f"{path}: unknown index format {version!r}; move it away and rebuild with "
            "`chatqna ingest --rebuild <paths>`"
        )
    if embedder != embedder_name or width != dimension:
        raise IndexUnavailable(
            f"the index at {path} was built with embedder {embedder!r} ({width} dimensions); "
            f"the configured embedder is {embedder_name!r} ({dimension}). Switch the embedder "
            "back, or rebuild with `chatqna ingest --rebuild <paths>`."
        )
    rows: dict[str, list[int]] = {source: [] for source in hashes}
    for position, chunk in enumerate(chunks):
        rows.setdefault(chunk.source, []).append(position)
    return [
        SourceBatch(
            source, [chunks[i] for i in positions], matrix[positions], hashes.get(source, "")
        )
        for source, positions in rows.items()
    ]
