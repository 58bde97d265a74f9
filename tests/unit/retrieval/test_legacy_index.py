"""Reading the previous index format for migration: every source kept, mismatches refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.legacy_index import read_legacy


def write_legacy(path: Path, embedder: str = "model", width: int = 4) -> np.ndarray:
    chunks = [
        {"id": "a-0", "text": "alpha", "source": "a.md", "title": "A", "index": 0},
        {"id": "b-0", "text": "beta", "source": "b.md", "title": "B", "index": 0},
        {"id": "a-1", "text": "alpha two", "source": "a.md", "title": "A", "index": 1},
    ]
    meta = {
        "format": 1,
        "embedder": embedder,
        "chunks": chunks,
        "hashes": {"a.md": "ha", "b.md": "hb", "empty.md": "he"},
    }
    matrix = np.arange(3 * width, dtype=np.float32).reshape(3, width)
    encoded = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with path.open("wb") as stream:
        np.savez(stream, embeddings=matrix, meta=encoded)
    return matrix


def test_sources_come_back_whole(tmp_path: Path) -> None:
    matrix = write_legacy(tmp_path / "index.npz")
    batches = {b.source: b for b in read_legacy(tmp_path / "index.npz", "model", 4)}
    assert sorted(batches) == ["a.md", "b.md", "empty.md"]
    assert [c.id for c in batches["a.md"].chunks] == ["a-0", "a-1"]
    assert np.array_equal(batches["a.md"].embeddings, matrix[[0, 2]])
    assert batches["b.md"].content_hash == "hb"
    assert batches["empty.md"].chunks == [] and batches["empty.md"].embeddings.shape == (0, 4)


@pytest.mark.parametrize(("name", "width"), [("other", 4), ("model", 8)])
def test_another_embedder_is_refused(tmp_path: Path, name: str, width: int) -> None:
    write_legacy(tmp_path / "index.npz")
    with pytest.raises(IndexUnavailable, match="rebuild") as caught:
        read_legacy(tmp_path / "index.npz", name, width)
    assert "'model' (4 dimensions)" in caught.value.message
