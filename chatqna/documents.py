"""Documents and chunks: the values that flow from ingestion through retrieval to the answer.

A `Chunk` is the unit the index stores and the retriever returns. Its id is deterministic
(`<doc_id>-<index>`, with `doc_id` derived from the source name), so re-ingesting a file
produces the same ids and replaces the old chunks instead of duplicating them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np


def doc_id_for(source: str) -> str:
    """Stable identifier of a source document, derived from its source name."""
    return hashlib.sha1(source.encode("utf-8")).hexdigest()[:16]


def chunk_id_for(source: str, index: int) -> str:
    """Stable identifier of the `index`-th chunk of `source`."""
    return f"{doc_id_for(source)}-{index:04d}"


# Part of every ingested file's content hash: a change to what `indexed_text` returns
# bumps it, so the next ingestion re-indexes files whose bytes did not change.
INDEXED_TEXT_VERSION = "title-line-1"


def indexed_text(title: str, text: str) -> str:
    """What a passage's dense and lexical legs index: its title line, then its text.

    A passage rarely repeats the heading it sits under ("Refunds", a page title), so a
    question that names the subject still finds it. The answer prompt and the sources a
    user sees carry the text alone.
    """
    return f"{title}\n{text}" if title else text


@dataclass(frozen=True)
class Chunk:
    """A passage of a source document, as stored in the index.

    `source` names the file the passage came from (relative to the ingestion root, or the
    uploaded file name), so a user can open it; `title` is the nearest heading or the
    document title.
    """

    id: str
    text: str
    source: str
    title: str = ""
    index: int = 0

    @property
    def doc_id(self) -> str:
        return doc_id_for(self.source)

    @property
    def indexed_text(self) -> str:
        """Its title line, then its text: what the embedding and BM25 index."""
        return indexed_text(self.title, self.text)


@dataclass(frozen=True)
class LoadedDocument:
    """A file turned into plain text sections, before chunking.

    `sections` is a list of `(heading, text)` pairs in reading order; a format with no
    headings yields one section whose heading is the document title.
    """

    source: str
    title: str
    sections: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class ScoredChunk:
    """A chunk with the scores the pipeline gave it on the way to the answer.

    `scores` maps a stage name (`dense`, `bm25`, `fusion`, `rerank`) to that stage's score.
    `embedding` is the stored passage vector when the retriever has it, so an embedding-based
    reranker does not embed the passage again.
    """

    chunk: Chunk
    score: float
    scores: dict[str, float] = field(default_factory=dict)
    embedding: np.ndarray | None = field(default=None, compare=False, repr=False)

    def with_score(self, stage: str, value: float) -> ScoredChunk:
        return replace(self, score=value, scores={**self.scores, stage: value})
