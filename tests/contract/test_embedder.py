"""The `Embedder` contract, over the embedded MiniLM (slow: loads the model), TEI, the
hashing stand-in the unit tests embed with, and the evaluation's on-disk cache in front of
TEI (a fresh cache, then one that answers from the file a first run saved)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import Embedder
from chatqna.backends.tei import TEIEmbedder
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache
from tests.contract import wire

pytestmark = pytest.mark.anyio


def tei() -> TEIEmbedder:
    return TEIEmbedder("http://tei.test", max_batch=4, transport=httpx2.MockTransport(wire.tei))


async def reopened_cache(directory: Path) -> CachingEmbedder:
    """A cache in front of TEI that a first run filled and saved, opened anew."""
    first = CachingEmbedder(tei(), EmbeddingCache(directory, "hashing"))
    await first.embed(["hello world", "short", "probe", "refund policy for annual plans"])
    await first.aclose()
    return CachingEmbedder(tei(), EmbeddingCache(directory, "hashing"))


@pytest.fixture(
    scope="module",
    params=[
        "tei",
        "fake",
        "caching",
        "caching-reopened",
        pytest.param("local", marks=pytest.mark.slow),
    ],
)
async def embedder(
    request: pytest.FixtureRequest, anyio_backend: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Embedder]:
    built: Embedder
    if request.param == "tei":
        built = tei()
    elif request.param == "fake":
        built = HashingEmbedder(wire.DIMENSION, max_batch=4)
    elif request.param == "caching":
        built = CachingEmbedder(tei(), EmbeddingCache(tmp_path_factory.mktemp("cache"), "hashing"))
    elif request.param == "caching-reopened":
        built = await reopened_cache(tmp_path_factory.mktemp("cache"))
    else:
        from chatqna.backends.local_embedder import OnnxMiniLMEmbedder

        built = OnnxMiniLMEmbedder(max_batch=4)
    yield built
    await built.aclose()


def test_it_is_an_embedder(embedder: Embedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.name and embedder.max_batch >= 1


async def test_one_unit_float32_row_per_text(embedder: Embedder) -> None:
    vectors = await embedder.embed(["hello world", "a second text", "third"])
    assert vectors.dtype == np.float32 and vectors.ndim == 2 and vectors.shape[0] == 3
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


async def test_rows_follow_the_input_order_beyond_one_batch(embedder: Embedder) -> None:
    texts = [f"text number {n} about topic {n * 7}" for n in range(2 * embedder.max_batch + 1)]
    together = await embedder.embed(texts)
    alone = np.vstack([await embedder.embed([text]) for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


async def test_texts_that_share_words_are_closer(embedder: Embedder) -> None:
    query, near, far = await embedder.embed(
        [
            "refund policy for annual plans",
            "annual plans have a refund policy",
            "two-factor authentication uses an authenticator app",
        ]
    )
    assert float(query @ near) > float(query @ far)


async def test_the_dimension_does_not_change(embedder: Embedder) -> None:
    first = await embedder.embed(["short"])
    second = await embedder.embed(["a much longer text about billing and invoices " * 10])
    assert first.shape[1] == second.shape[1] > 0


async def test_no_texts_is_a_value_error(embedder: Embedder) -> None:
    with pytest.raises(ValueError):
        await embedder.embed([])


async def test_describe_reports_the_dimension(embedder: Embedder) -> None:
    dimension = (await embedder.embed(["probe"])).shape[1]
    details = await embedder.describe()
    assert isinstance(details["kind"], str) and details["dimension"] == dimension


async def test_tei_is_named_by_the_model_its_info_names(tmp_path: Path) -> None:
    identified = tei()
    assert await identified.identify() == f"tei:{wire.INFO['model_id']}"
    cached = CachingEmbedder(identified, EmbeddingCache(tmp_path, identified.name))
    assert cached.name == identified.name
    await cached.aclose()
    await identified.aclose()
