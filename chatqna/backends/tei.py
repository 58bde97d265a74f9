"""Remote embedder and reranker speaking Text Embeddings Inference (TEI) wire formats.

- Embeddings: TEI's OpenAI-compatible `POST /v1/embeddings` with `{"input": [...]}` (a lone
  text as `{"input": "..."}`), answered
  by `{"data": [{"index": i, "embedding": [...]}, ...]}`. A batch of texts is one call, as
  long as it fits `max_batch` (TEI's `--max-client-batch-size`, 32 by default).
- Reranking: `POST /rerank` with `{"query", "texts"}`, answered by `[{"index", "score"}]`.

- Identity: `GET /info`, whose `model_id` names the model served (`TEIEmbedder.identify`).

The calls are idempotent: each attempt is bounded by `timeout_seconds` as a whole, and a
retryable failure is tried again by the `RetryPolicy` given (none by default).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import httpx2
import numpy as np

from chatqna.backends.vectors import l2_normalise
from chatqna.documents import ScoredChunk
from chatqna.errors import BadUpstreamResponse
from chatqna.upstream.client import UpstreamClient, without_credentials
from chatqna.upstream.policy import (
    NO_RETRY,
    UPSTREAM_FAILURES,
    RetryPolicy,
    get_reply,
    post_json,
    raise_for_status,
    require,
    translate_http_error,
)

logger = logging.getLogger(__name__)

# On the embedding call's client span (`POST /v1/embeddings`): how many texts it carries.
# Kept here, not in `chatqna.telemetry.names`, which the model clients do not import.
EMBEDDING_INPUTS = "chatqna.embedding.inputs"

# How large an answer may be, by what was asked (the client's 64 MiB stays the outer bound):
# a body past it is a bad response while it is read, before it is parsed, which would hold
# the event loop for as long as a large body takes. A number in JSON is at most 25
# characters (`-1.2345678901234567e-100`) and a comma; an embedding item's own fields
# (`"object"`, `"index"`) and a rerank item (`{"index": 99, "score": -12.345678}`) are under
# 100 bytes. More than twice those, and 64 KiB for the rest of the body (`model`, `usage`).
BYTES_PER_NUMBER = 64
BYTES_PER_ITEM = 256
REPLY_OVERHEAD_BYTES = 64 * 1024
# The width a body is sized for: above the widest embedding models served (4,096), whatever
# width is expected, so that the answer of a model swapped for a wider one is still read.
UNKNOWN_DIMENSION = 8192


def embeddings_bytes(count: int, expected: int | None) -> int:
    """The most body an embeddings answer of `count` vectors may have, when vectors
    `expected` wide (None: not known yet) were asked for.

    The width allowed is never below `UNKNOWN_DIMENSION`: sized by the index's width alone,
    the answer of a wider model (an index of 384 after a swap to a 4,096-wide one) would be
    refused as too large before its width is checked, hiding the "dimension 4096, expected
    384" the operator needs. The client's 64 MiB stays the outer bound.
    """
    width = UNKNOWN_DIMENSION if expected is None else max(expected, UNKNOWN_DIMENSION)
    return REPLY_OVERHEAD_BYTES + count * (BYTES_PER_ITEM + width * BYTES_PER_NUMBER)


def rerank_bytes(count: int) -> int:
    """The most body a rerank answer of `count` scores may have."""
    return REPLY_OVERHEAD_BYTES + count * BYTES_PER_ITEM


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def in_input_order(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The embedding items of a reply in the order of the inputs. Either every item names
    its input by `index` (an int, each of 0..n-1 once) or none does, and then they come
    in input order; an index on some items only could put a vector on the wrong text."""
    indexed = ["index" in item for item in items]
    if not any(indexed):
        return items
    require(all(indexed), backend="embedder", what="only some embeddings have an index")
    indexes = [item["index"] for item in items]
    require(
        all(_is_int(index) for index in indexes) and sorted(indexes) == list(range(len(items))),
        backend="embedder",
        what=f"indexes {indexes} do not name the {len(items)} inputs once each",
    )
    return sorted(items, key=lambda item: int(item["index"]))


def served_model_id(body: Any) -> str | None:
    """The model a TEI `GET /info` body names (`model_id`: the `--model-id` TEI was started
    with, a Hub id or a local path), or None when it names none."""
    model_id = body.get("model_id") if isinstance(body, dict) else None
    if isinstance(model_id, str) and model_id.strip():
        return model_id.strip()
    return None


def embeddings_matrix(body: Any, count: int) -> np.ndarray:
    """The `count` vectors of an OpenAI-style `/v1/embeddings` reply, in input order, as one
    float32 matrix; any departure from the documented shape is a `BadUpstreamResponse`."""
    require(
        isinstance(body, dict) and isinstance(body.get("data"), list),
        backend="embedder",
        what="no `data` list",
    )
    data = body["data"]
    require(
        len(data) == count,
        backend="embedder",
        what=f"{len(data)} embeddings for {count} inputs",
    )
    require(
        all(isinstance(item, dict) for item in data),
        backend="embedder",
        what="embedding items are not objects",
    )
    vectors = [item.get("embedding") for item in in_input_order(data)]
    require(
        all(isinstance(v, list) for v in vectors),
        backend="embedder",
        what="an embedding is not a list",
    )
    try:
        # numpy decides the element type in C: numbers only give an integer or float
        # array; strings, nulls or nested lists give another kind, ragged rows an error.
        parsed = np.array(vectors)
    except ValueError as exc:
        raise BadUpstreamResponse("embedder: ragged embeddings", backend="embedder") from exc
    require(
        parsed.dtype.kind in "iuf",
        backend="embedder",
        what="an embedding is not a list of numbers",
    )
    matrix = parsed.astype(np.float32)
    require(
        matrix.ndim == 2 and matrix.shape[1] > 0 and bool(np.isfinite(matrix).all()),
        backend="embedder",
        what="embeddings are not equal-length finite vectors",
    )
    return matrix


class TEIEmbedder:
    """Embedder backed by a TEI server's `/v1/embeddings`; one HTTP call per batch.

    `name`, what an index records as the embedder that built it, is `tei:<endpoint>` until
    `identify()` reads the model TEI serves: `tei:<model_id>` from then on, so the same
    model reached through another URL opens the same index. `url_name` stays the URL form.

    `dimension` is the width every vector must have, when it is known: given here, or set
    by `chatqna.composition` to the width of the index the service opened. Without it (a
    retriever service holds the index), replies are held to the width the latest readiness
    probe measured, and each probe measures it afresh. A reply of another width fails
    alone, as a `BadUpstreamResponse`; a chat's reply never sets the width, so one wrong
    reply cannot fail every later, right one.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        max_batch: int = 32,
        timeout_seconds: float = 30.0,
        connect_timeout_seconds: float = 5.0,
        dimension: int | None = None,
        retry: RetryPolicy | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if dimension is not None and dimension < 1:
            raise ValueError("dimension must be at least 1")
        self.endpoint = without_credentials(endpoint)
        self._timeout = timeout_seconds
        self._retry = retry if retry is not None else NO_RETRY
        self.url_name = f"tei:{self.endpoint}"
        self.name = self.url_name
        self.model_id: str | None = None
        self.max_batch = max_batch
        self.dimension = dimension
        self._probed_dimension: int | None = None
        self.calls = 0
        self.texts_embedded = 0
        self._client = UpstreamClient(
            endpoint,
            timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
            transport=transport,
        )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            raise ValueError("embed() needs at least one text")
        expected = self.dimension if self.dimension is not None else self._probed_dimension
        parts = []
        for start in range(0, len(texts), self.max_batch):
            batch = list(texts[start : start + self.max_batch])
            parts.append(await self._embed_batch(batch, expected))
            self.calls += 1
            self.texts_embedded += len(batch)
        widths = sorted({part.shape[1] for part in parts})
        require(len(widths) == 1, backend="embedder", what=f"batches of dimensions {widths}")
        return np.vstack(parts)

    async def _embed_batch(
        self, texts: list[str], expected: int | None, retry: RetryPolicy | None = None
    ) -> np.ndarray:
        # A lone text goes as a plain string, the baseline shape of OPEA's embedding call;
        # several go as one batched list.
        payload = {"input": texts[0] if len(texts) == 1 else texts}
        body = await post_json(
            self._client,
            "/v1/embeddings",
            payload,
            backend="embedder",
            retry=self._retry if retry is None else retry,
            timeout_seconds=self._timeout,
            max_body_bytes=embeddings_bytes(len(texts), expected),
            span_attributes={EMBEDDING_INPUTS: len(texts)},
        )
        matrix = embeddings_matrix(body, len(texts))
        require(
            expected is None or matrix.shape[1] == expected,
            backend="embedder",
            what=f"dimension {matrix.shape[1]}, expected {expected}",
        )
        return l2_normalise(matrix)

    async def identify(self) -> str:
        """Name this embedder by the model TEI serves, read from `GET /info`, and return
        the name: `tei:<model_id>`, or `tei:<endpoint>` from a TEI-compatible server
        without `/info` (a 4xx, a body that is not JSON or has no `model_id`). Tried as an
        embedding call is (`timeout_seconds` each, the `RetryPolicy`); a failure that
        outlasts them raises, rather than name the embedder by a guess.

        Only the model id counts, not its revision (`model_sha`): a model re-uploaded under
        the same id, with other vectors, is not told apart.
        """
        reply = await get_reply(
            self._client,
            "/info",
            backend="embedder",
            retry=self._retry,
            timeout_seconds=self._timeout,
        )
        self.model_id, found = None, f"HTTP {reply.status}"
        if reply.status < 400:
            try:
                self.model_id, found = served_model_id(reply.json()), "no model_id"
            except (json.JSONDecodeError, UnicodeDecodeError):
                found = "a body that is not JSON"
        self.name = self.url_name if self.model_id is None else f"tei:{self.model_id}"
        if self.model_id is not None:
            logger.info(
                "embedder identity: %s, from GET /info of %s (an index built by this model "
                "through another URL opens too)",
                self.name,
                self.endpoint,
            )
        else:
            logger.info(
                "embedder identity: %s, GET /info of %s gave %s (an index built through "
                "another URL is refused)",
                self.name,
                self.endpoint,
                found,
            )
        return self.name

    async def describe(self) -> dict[str, Any]:
        # Every time, as the other roles' probes: TEI answers now, at the index's width if
        # known. One attempt, so the probe is bounded by `timeout_seconds` as a whole.
        # Not counted in `calls`/`texts_embedded`: those are the service's own embeddings.
        probe = await self._embed_batch(["readiness probe"], self.dimension, retry=NO_RETRY)
        self._probed_dimension = int(probe.shape[1])
        return {
            "kind": "tei",
            "endpoint": self.endpoint,
            "model": self.model_id,
            "dimension": self._probed_dimension,
            "calls": self.calls,
            "texts_embedded": self.texts_embedded,
        }

    async def aclose(self) -> None:
        await self._client.aclose()


class TEIReranker:
    """Reranker backed by a TEI server's `/rerank` (a cross-encoder such as bge-reranker)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_seconds: float = 30.0,
        connect_timeout_seconds: float = 5.0,
        retry: RetryPolicy | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoint = without_credentials(endpoint)
        self.name = f"tei:{self.endpoint}"
        self.calls = 0
        self._timeout = timeout_seconds
        self._retry = retry if retry is not None else NO_RETRY
        self._client = UpstreamClient(
            endpoint,
            timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
            transport=transport,
        )

    async def rerank(
        self,
        query: str,
        candidates: Sequence[ScoredChunk],
        top_n: int,
        vector: np.ndarray | None = None,
    ) -> list[ScoredChunk]:
        """Score `(query, passage)` pairs with the cross-encoder; `vector` is not used."""
        if top_n < 1:
            raise ValueError("top_n must be at least 1")
        if not candidates:
            return []
        payload = {
            "query": query,
            "texts": [candidate.chunk.text for candidate in candidates],
            "truncate": True,
        }
        body = await post_json(
            self._client,
            "/rerank",
            payload,
            backend="reranker",
            retry=self._retry,
            timeout_seconds=self._timeout,
            max_body_bytes=rerank_bytes(len(candidates)),
        )
        self.calls += 1
        require(isinstance(body, list), backend="reranker", what="body is not a list")
        scored: list[ScoredChunk] = []
        seen: set[int] = set()
        for item in body:
            require(
                isinstance(item, dict) and "index" in item and "score" in item,
                backend="reranker",
                what="item without index/score",
            )
            index, score = item["index"], item["score"]
            require(
                _is_int(index) and 0 <= index < len(candidates) and index not in seen,
                backend="reranker",
                what=f"bad index {index!r}",
            )
            require(_is_number(score), backend="reranker", what="score not a number")
            seen.add(index)
            scored.append(candidates[index].with_score("rerank", float(score)))
        scored.sort(key=lambda item: item.score, reverse=True)
        return scored[:top_n]

    async def describe(self) -> dict[str, Any]:
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._client.get("/health")
            raise_for_status(reply)
        except UPSTREAM_FAILURES as exc:
            raise translate_http_error(exc, backend="reranker", what="GET /health") from exc
        return {"kind": "tei", "endpoint": self.endpoint, "calls": self.calls}

    async def aclose(self) -> None:
        await self._client.aclose()
