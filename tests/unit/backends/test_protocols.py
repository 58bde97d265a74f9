"""The Protocols' helpers: an embedder's dimension, declared or measured."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import embedding_dimension

pytestmark = pytest.mark.anyio


class Undeclared:
    """An embedder that does not say how wide its vectors are."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        return np.zeros((len(texts), 24), dtype=np.float32)


async def test_a_declared_dimension_is_used_without_embedding() -> None:
    embedder = HashingEmbedder(48)
    assert await embedding_dimension(embedder) == 48
    assert embedder.batches == []


async def test_an_undeclared_dimension_is_measured_with_one_call() -> None:
    embedder = Undeclared()
    assert await embedding_dimension(embedder) == 24  # type: ignore[arg-type]
    assert len(embedder.batches) == 1
