"""The on-disk embedding cache: each text embedded once, persisted by model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache

pytestmark = pytest.mark.anyio


async def test_cache_embeds_each_text_once_and_persists(tmp_path: Path) -> None:
    inner = HashingEmbedder()
    cache = EmbeddingCache(tmp_path, inner.name)
    embedder = CachingEmbedder(inner, cache)
    first = await embedder.embed(["a b", "c d", "a b"])
    second = await embedder.embed(["c d"])
    assert inner.batches == [["a b", "c d"]]
    assert embedder.inputs_requested == 4 and embedder.inputs_computed == 2
    np.testing.assert_array_equal(first[1], second[0])
    cache.save()
    reopened = EmbeddingCache(tmp_path, inner.name)
    assert len(reopened) == 2
    np.testing.assert_array_equal(reopened.get("a b"), first[0])
    assert len(EmbeddingCache(tmp_path, "another-model")) == 0
