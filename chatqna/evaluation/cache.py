"""An on-disk embedding cache keyed by model and text, and an embedder that uses it.

The benchmark embeds the same corpus and the same queries over and over; the cache makes
reruns fast. Keys are `sha256(text)`; one `.npz` file per model, rewritten atomically.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chatqna.backends.protocols import Embedder


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """Vectors of one model, by text hash; `save()` persists what was added."""

    def __init__(self, directory: Path, model: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
        self.path = directory / f"embeddings-{safe}.npz"
        self._vectors: dict[str, np.ndarray] = {}
        self._dirty = False
        if self.path.exists():
            with np.load(self.path, allow_pickle=False) as archive:
                for key, vector in zip(archive["keys"], archive["vectors"], strict=True):
                    self._vectors[str(key)] = vector

    def __len__(self) -> int:
        return len(self._vectors)

    def get(self, text: str) -> np.ndarray | None:
        return self._vectors.get(text_key(text))

    def put(self, text: str, vector: np.ndarray) -> None:
        self._vectors[text_key(text)] = np.asarray(vector, dtype=np.float32)
        self._dirty = True

    def save(self) -> None:
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.asarray(list(self._vectors), dtype="U64")
        vectors = np.vstack(list(self._vectors.values()))
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, keys=keys, vectors=vectors)
        os.replace(temporary, self.path)
        self._dirty = False


class CachingEmbedder:
    """An `Embedder` that answers from the cache and embeds only the texts it lacks.

    `inputs_requested` counts every text asked for (the cost a live system would pay);
    `inputs_computed` counts the ones that really ran through the model.
    """

    def __init__(self, inner: Embedder, cache: EmbeddingCache) -> None:
        self.inner = inner
        self.cache = cache
        self.name = inner.name
        self.max_batch = inner.max_batch
        self.inputs_requested = 0
        self.inputs_computed = 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.inputs_requested += len(texts)
        missing = [text for text in dict.fromkeys(texts) if self.cache.get(text) is None]
        if missing:
            fresh = await self.inner.embed(missing)
            self.inputs_computed += len(missing)
            for text, vector in zip(missing, fresh, strict=True):
                self.cache.put(text, vector)
        rows = [self.cache.get(text) for text in texts]
        return np.vstack([row for row in rows if row is not None])

    async def describe(self) -> dict[str, Any]:
        return {**await self.inner.describe(), "cache": str(self.cache.path)}

    async def aclose(self) -> None:
        self.cache.save()
