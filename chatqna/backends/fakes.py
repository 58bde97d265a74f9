"""Deterministic in-memory backends for tests and benchmarks of the pipeline's own logic.

They implement the same Protocols as the real backends and record what they were asked,
so a test can assert what the pipeline sent where (which texts were embedded in which
call, which query the reranker saw, which prompt the LLM got).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from chatqna.backends.protocols import (
    Completion,
    Delta,
    GenerationParams,
    Retriever,
    SearchQuery,
    SourceBatch,
    SourceInfo,
    Usage,
)
from chatqna.backends.vectors import l2_normalise
from chatqna.documents import ScoredChunk
from chatqna.errors import ContextTooLong
from chatqna.retrieval.query import tokenize


class HashingEmbedder:
    """Bag-of-words vectors by feature hashing: texts sharing words get similar vectors."""

    def __init__(self, dimension: int = 64, *, max_batch: int = 32) -> None:
        self.name = f"hashing-{dimension}"
        self.dimension = dimension
        self.max_batch = max_batch
        self.batches: list[list[str]] = []

    def vector(self, text: str) -> np.ndarray:
        row = np.zeros(self.dimension, dtype=np.float32)
        for token in tokenize(text) or ["<empty>"]:
            digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
            row[int.from_bytes(digest, "little") % self.dimension] += 1.0
        return row

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        return l2_normalise(np.vstack([self.vector(t) for t in texts]))

    async def describe(self) -> dict[str, Any]:
        return {"kind": "fake", "dimension": self.dimension, "calls": len(self.batches)}

    async def aclose(self) -> None:
        return None


class RecordingReranker:
    """Ranks candidates by the share of the query's words their text holds (as a text-reading
    reranker, it ignores `vector`); ties keep the retrieval order. Records the query and the
    vector it was given."""

    name = "recording"

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.vectors: list[np.ndarray | None] = []

    async def rerank(
        self,
        query: str,
        candidates: Sequence[ScoredChunk],
        top_n: int,
        vector: np.ndarray | None = None,
    ) -> list[ScoredChunk]:
        self.queries.append(query)
        self.vectors.append(vector)
        wanted = set(tokenize(query))
        scored = [
            c.with_score("rerank", len(wanted & set(tokenize(c.chunk.text))) / max(len(wanted), 1))
            for c in candidates
        ]
        return sorted(scored, key=lambda c: c.score, reverse=True)[:top_n]

    async def describe(self) -> dict[str, Any]:
        return {"kind": "fake", "calls": len(self.queries)}

    async def aclose(self) -> None:
        return None


class ScriptedLLM:
    """Answers every request with `reply`; records each prompt and its parameters.

    It keeps the `ChatLLM` contract as the real clients do: a token is a word (with the
    whitespace before it), so `max_tokens` cuts the reply to that many words and reports
    `finish_reason="length"`; the stream's pieces join to exactly the whole completion, and
    its last delta carries the finish reason and the usage; a prompt of more words than
    `context` raises `ContextTooLong`, whole or streamed.

    `fail_after` makes the stream raise `error` after that many pieces, to exercise errors
    that happen after a stream has started; `error` alone makes every call raise it.
    """

    def __init__(
        self,
        reply: str = "This is the answer.",
        *,
        model: str = "scripted",
        context: int = 2048,
        fail_after: int | None = None,
        error: Exception | None = None,
    ) -> None:
        self.reply = reply
        self.model = model
        self.context = context
        self.prompts: list[list[dict[str, str]]] = []
        self.params: list[GenerationParams] = []
        self.fail_after = fail_after
        self.error = error

    def _answer(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> tuple[list[str], str, Usage]:
        """Record the request; the reply's pieces (cut to `max_tokens`), the finish reason
        and the usage; or raise what the request should raise."""
        self.prompts.append(list(messages))
        self.params.append(params)
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        if prompt_tokens > self.context:
            raise ContextTooLong(
                f"llm: the prompt is longer than the model's context window ({prompt_tokens} "
                f"prompt tokens, a context of {self.context})"
            )
        if self.error is not None and self.fail_after is None:
            raise self.error
        pieces = re.findall(r"\s*\S+", self.reply)
        trailing = self.reply[len("".join(pieces)) :]
        if trailing:  # whitespace after the last word (or a reply of whitespace only)
            pieces.append(trailing)
        finish = "stop"
        if params.max_tokens is not None and params.max_tokens < len(pieces):
            pieces, finish = pieces[: params.max_tokens], "length"
        return pieces, finish, Usage(prompt_tokens=prompt_tokens, completion_tokens=len(pieces))

    async def complete(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> Completion:
        pieces, finish, usage = self._answer(messages, params)
        return Completion("".join(pieces), finish, usage)

    async def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        pieces, finish, usage = self._answer(messages, params)
        for position, piece in enumerate(pieces):
            if self.error is not None and position >= (self.fail_after or 0):
                raise self.error
            yield Delta(text=piece)
        yield Delta(finish_reason=finish, usage=usage)

    async def describe(self) -> dict[str, Any]:
        return {"kind": "fake", "model": self.model, "calls": len(self.prompts)}

    async def aclose(self) -> None:
        return None


class RecordingRetriever:
    """Wraps a real retriever and records every `SearchQuery` it is given."""

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner
        self.queries: list[SearchQuery] = []
        self.supports_bm25_history = inner.supports_bm25_history

    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        self.queries.append(query)
        return await self.inner.search(query)

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        await self.inner.replace_sources(batches)

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        return await self.inner.delete_sources(sources)

    async def list_sources(self) -> list[SourceInfo]:
        return await self.inner.list_sources()

    async def describe(self) -> dict[str, Any]:
        return await self.inner.describe()

    async def aclose(self) -> None:
        await self.inner.aclose()
