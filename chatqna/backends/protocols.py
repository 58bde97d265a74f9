"""One Protocol per backend role, and the small value objects they exchange.

Each role has an embedded implementation (runs in-process, no servers) and a remote one
(TEI, an OpenAI-compatible server, Redis...). `chatqna.composition.build_backends`
picks one per role from `Settings`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from chatqna.documents import Chunk, ScoredChunk


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors, one batched call per `embed`."""

    name: str
    max_batch: int

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return a float32 array of shape `(len(texts), dimension)`, rows L2-normalised."""
        ...

    async def describe(self) -> dict[str, Any]:
        """Readiness details (model, dimension, counters); raises when unreachable."""
        ...

    async def aclose(self) -> None: ...


async def embedding_dimension(embedder: Embedder) -> int:
    """The width of `embedder`'s vectors: its `dimension` when it has one, else measured."""
    dimension = getattr(embedder, "dimension", None)
    if isinstance(dimension, int):
        return dimension
    return int((await embedder.embed(["dimension probe"])).shape[1])


@dataclass(frozen=True)
class SearchQuery:
    """What the retriever searches with.

    `embedding` drives the dense leg (it may be a blended vector); `text` drives the BM25 leg.
    `hybrid=False` runs the dense leg alone. `fusion_weights` are the reciprocal-rank-fusion
    weights of the (dense, BM25) legs; equal weights are plain RRF. `bm25_history` (earlier
    user questions) adds its content words to the BM25 query at `bm25_history_weight`.
    """

    text: str
    embedding: np.ndarray
    k: int
    hybrid: bool = True
    fusion_weights: tuple[float, float] = (1.0, 1.0)
    bm25_history: str = ""
    bm25_history_weight: float = 0.0


@dataclass(frozen=True)
class SourceInfo:
    """One ingested source file as the index knows it."""

    source: str
    chunks: int
    content_hash: str = ""


@runtime_checkable
class Retriever(Protocol):
    """A searchable store of chunks: dense + BM25 legs fused by RRF, or dense only.

    `supports_bm25_history` says whether `search` honours `SearchQuery.bm25_history` (the
    history-aware BM25 leg); a retriever behind an API without that field says False, and
    the pipeline then reports the leg as not run.
    """

    supports_bm25_history: bool

    async def search(self, query: SearchQuery) -> list[ScoredChunk]: ...

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        """Replace every chunk of each batch's source with the batch's chunks, atomically."""
        ...

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        """Delete the chunks of these sources (all sources when None); return chunks removed."""
        ...

    async def list_sources(self) -> list[SourceInfo]: ...

    async def describe(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class SourceBatch:
    """The complete new content of one source: its chunks and their embeddings."""

    source: str
    chunks: Sequence[Chunk]
    embeddings: np.ndarray
    content_hash: str = ""


@runtime_checkable
class Reranker(Protocol):
    """Re-scores retrieved candidates against a query and keeps the best `top_n`.

    `query` is the text a cross-encoder reads; `vector`, when given, is the embedding an
    embedding-similarity reranker scores with instead of embedding `query` itself (on a
    blended follow-up, the blended vector). Rerankers that read text ignore `vector`.
    """

    name: str

    async def rerank(
        self,
        query: str,
        candidates: Sequence[ScoredChunk],
        top_n: int,
        vector: np.ndarray | None = None,
    ) -> list[ScoredChunk]: ...

    async def describe(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters passed to the chat LLM; `None` means the server's default.

    `temperature=0` is a real zero and is sent as such.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_format: dict[str, Any] | None = None

    def to_openai(self) -> dict[str, Any]:
        fields = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": self.stop,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "response_format": self.response_format,
        }
        return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True)
class Usage:
    """Token counts as the LLM server reported them (zeros when it did not)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """A whole (non-streamed) chat completion."""

    text: str
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class Delta:
    """One streamed piece of a chat completion; the last one carries `finish_reason`.

    A client may hand over in one `Delta` the chunks that arrived together (one network
    read): `pieces` are then their texts in order, one per upstream chunk, and `text` is
    their concatenation, so the answer's stream can still send one chunk per piece, in one
    write. Without `pieces`, `text` is one piece.
    """

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    pieces: tuple[str, ...] = ()

    def texts(self) -> tuple[str, ...]:
        """The pieces of text this delta carries, in order (none when it has no text)."""
        if self.pieces:
            return self.pieces
        return (self.text,) if self.text else ()


@runtime_checkable
class ChatLLM(Protocol):
    """An OpenAI-style chat model, whole or streamed."""

    model: str

    async def complete(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> Completion: ...

    def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]: ...

    async def describe(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...
