"""The packaged MiniLM embedder: shape, normalisation, order, and meaning."""

from __future__ import annotations

import numpy as np
import pytest

from chatqna.backends.local_embedder import OnnxMiniLMEmbedder

pytestmark = pytest.mark.slow  # loads the packaged ONNX model


@pytest.fixture(scope="module")
def embedder() -> OnnxMiniLMEmbedder:
    return OnnxMiniLMEmbedder()


def test_vectors_are_384_wide_and_unit_length(embedder: OnnxMiniLMEmbedder) -> None:
    vectors = embedder.embed_sync(["hello world", "a second sentence"])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_a_batch_gives_the_same_rows_as_single_calls_in_input_order(
    embedder: OnnxMiniLMEmbedder,
) -> None:
    texts = ["short", "a much longer text about refunds and billing " * 20, "medium text", "x"]
    batch = embedder.embed_sync(texts)
    singles = np.vstack([embedder.embed_sync([text]) for text in texts])
    np.testing.assert_allclose(batch, singles, atol=1e-5)


def test_similar_texts_are_closer(embedder: OnnxMiniLMEmbedder) -> None:
    query, near, far = embedder.embed_sync(
        [
            "How do I get my money back?",
            "Refunds are paid to the original card.",
            "Two-factor authentication uses an authenticator app.",
        ]
    )
    assert float(query @ near) > float(query @ far)


def test_long_text_is_truncated_not_rejected(embedder: OnnxMiniLMEmbedder) -> None:
    assert embedder.embed_sync(["word " * 2000]).shape == (1, 384)


def test_empty_input_is_rejected(embedder: OnnxMiniLMEmbedder) -> None:
    with pytest.raises(ValueError):
        embedder.embed_sync([])


@pytest.mark.anyio
async def test_async_embed_counts_calls_and_texts(embedder: OnnxMiniLMEmbedder) -> None:
    before = embedder.texts_embedded
    await embedder.embed(["one", "two"])
    assert embedder.texts_embedded == before + 2
    assert (await embedder.describe())["dimension"] == 384
