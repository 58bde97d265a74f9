"""Remote retriever: a retriever service speaking OPEA's `/v1/retrieval` (ours or OPEA's).

The megaservice sends the query text and the embedding it already computed (the blended
vector, in blend mode), so the service searches with it instead of embedding again.
Ingestion goes to the retriever service's own dataprep endpoints; through this client the
index can be listed and sources deleted, but chunks cannot be written (`NotSupported`).
Searches and listings are idempotent: each attempt is bounded by `timeout_seconds` as a
whole and retried by the `RetryPolicy` given; deletions are tried once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import httpx2
import numpy as np

from chatqna.backends.protocols import SearchQuery, SourceBatch, SourceInfo
from chatqna.documents import Chunk, ScoredChunk
from chatqna.errors import NotSupported, UpstreamError
from chatqna.upstream.client import UpstreamClient, without_credentials
from chatqna.upstream.policy import (
    NO_RETRY,
    UPSTREAM_FAILURES,
    HTTPStatusFailure,
    RetryPolicy,
    post_json,
    require,
    translate_http_error,
)

BACKEND = "retriever"


def is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def optional(
    fields: dict[str, Any],
    key: str,
    kind: type | Callable[[Any], bool],
    what: str,
    default: Any,
) -> Any:
    """`fields[key]`, or `default` when it is absent or null; a value of another kind
    (`kind` a type, or a test) is a `BadUpstreamResponse` naming the field `what`."""
    value = fields.get(key)
    if value is None:
        return default
    fits = isinstance(value, kind) if isinstance(kind, type) else kind(value)
    require(fits, backend=BACKEND, what=f"malformed {what}")
    return value


class RemoteRetriever:
    """A `Retriever` backed by `POST /v1/retrieval` on another service.

    OPEA's retrieval API has no field for earlier questions, so the history-aware BM25 leg
    cannot run behind it.
    """

    supports_bm25_history = False

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_seconds: float = 30.0,
        connect_timeout_seconds: float = 5.0,
        headers: dict[str, str] | None = None,
        retry: RetryPolicy | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoint = without_credentials(endpoint)
        self.calls = 0
        self._timeout = timeout_seconds
        self._retry = retry if retry is not None else NO_RETRY
        self._client = UpstreamClient(
            endpoint,
            timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
            headers=headers,
            transport=transport,
        )

    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        payload = {
            "text": query.text,
            "embedding": np.asarray(query.embedding, dtype=np.float32).tolist(),
            "k": query.k,
            "hybrid": query.hybrid,
            "search_type": "similarity",
            "fusion_weights": list(query.fusion_weights),
        }
        body = await post_json(
            self._client,
            "/v1/retrieval",
            payload,
            backend=BACKEND,
            retry=self._retry,
            timeout_seconds=self._timeout,
        )
        self.calls += 1
        require(
            isinstance(body, dict) and isinstance(body.get("retrieved_docs"), list),
            backend=BACKEND,
            what="no retrieved_docs list",
        )
        return [self._scored(item) for item in body["retrieved_docs"]]

    @staticmethod
    def _scored(item: Any) -> ScoredChunk:
        require(
            isinstance(item, dict) and isinstance(item.get("text"), str),
            backend=BACKEND,
            what="a retrieved doc without text",
        )
        metadata = optional(item, "metadata", dict, "metadata", {})
        scores = optional(metadata, "scores", dict, "metadata.scores", {})
        # A score a service could not encode (JSON has no NaN) comes as null: left out.
        given = {str(name): value for name, value in scores.items() if value is not None}
        require(
            all(is_finite_number(value) for value in given.values()),
            backend=BACKEND,
            what="malformed metadata.scores",
        )
        score = optional(item, "score", is_finite_number, "score", 0.0)
        chunk_index = optional(metadata, "chunk_index", is_count, "metadata.chunk_index", 0)
        chunk = Chunk(
            id=optional(item, "id", str, "id", ""),
            text=item["text"],
            source=optional(metadata, "source", str, "metadata.source", ""),
            title=optional(metadata, "title", str, "metadata.title", ""),
            index=chunk_index,
        )
        return ScoredChunk(chunk, float(score), {k: float(v) for k, v in given.items()})

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        raise NotSupported(
            "with RETRIEVER_ENDPOINT set, ingest through the retriever service's "
            "POST /v1/dataprep/ingest"
        )

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        removed = 0
        for name in ["all"] if sources is None else list(sources):
            try:
                body = await post_json(
                    self._client,
                    "/v1/dataprep/delete",
                    {"file_path": name},
                    backend=BACKEND,
                    timeout_seconds=self._timeout,
                )
            except UpstreamError as exc:
                cause = exc.__cause__
                if isinstance(cause, HTTPStatusFailure) and cause.status == 404:
                    continue  # the service holds no such source: nothing removed
                raise
            require(isinstance(body, dict), backend=BACKEND, what="deletion reply is not an object")
            removed += optional(body, "removed_chunks", is_count, "removed_chunks", 0)
        return removed

    async def list_sources(self) -> list[SourceInfo]:
        body = await post_json(
            self._client,
            "/v1/dataprep/get",
            {},
            backend=BACKEND,
            retry=self._retry,
            timeout_seconds=self._timeout,
        )
        require(isinstance(body, list), backend=BACKEND, what="file list is not a list")
        return [self._source(item) for item in body]

    @staticmethod
    def _source(item: Any) -> SourceInfo:
        require(
            isinstance(item, dict) and isinstance(item.get("name"), str),
            backend=BACKEND,
            what="a listed file without a name",
        )
        return SourceInfo(item["name"], optional(item, "chunks", is_count, "chunks", 0))

    async def describe(self) -> dict[str, Any]:
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._client.get("/v1/ready")
        except UPSTREAM_FAILURES as exc:
            raise translate_http_error(exc, backend=BACKEND, what="GET /v1/ready") from exc
        require(
            reply.status == 200,
            backend=BACKEND,
            what=f"retriever service not ready (HTTP {reply.status})",
        )
        return {"kind": "remote", "endpoint": self.endpoint, "calls": self.calls}

    async def aclose(self) -> None:
        await self._client.aclose()
