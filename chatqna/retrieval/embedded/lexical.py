r"""The embedded index's BM25 leg: a tantivy index in `<index dir>/lexical/`.

tantivy (the Rust search library, through its Python bindings) keeps an inverted index in
immutable segments, writes incrementally (a commit adds a segment and marks deleted
documents; segments merge in the background) and answers a top-k union query with
block-max pruning instead of scoring every match. Its scorer is BM25 with `k1 = 1.2`,
`b = 0.75` and `idf = ln(1 + (N - df + 0.5) / (df + 0.5))`, over document lengths stored
in one byte (tantivy's field norms), so scores differ slightly from RediSearch's `BM25STD`
(`b = 0.5`, exact lengths): rankings agree on the clear cases, not to the last bit.

Documents are tokenised as `chatqna.retrieval.query.tokenize` does (lower-cased `\w+`
runs, stop words and tokens over 64 bytes dropped), the same tokens the Redis index and
the query see: Python splits the words (its regular expressions define `\w`), and a tantivy
analyzer drops stop words and long tokens in Rust, which saves about 40% of ingestion's
tokenising time. Each document carries the chunk's row id in the store of record (a fast
field, read without loading the document) and its source (to delete a source's documents
by term). A follow-up's query is the union of
its own terms plus the union of the earlier questions' terms boosted by
`bm25_history_weight`, the same shape as `chatqna.retrieval.query.query_tree`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tantivy

from chatqna.retrieval.query import (
    MAX_TOKEN_BYTES,
    STOP_WORDS,
    TOKEN_PATTERN,
    WeightedQuery,
)

LEXICAL_DIR = "lexical"
ANALYZER = "chatqna_words"
WRITER_HEAP_BYTES = 64 * 1024 * 1024
Document = tuple[int, str, str]  # (row id, source, text)


def analyzer() -> tantivy.TextAnalyzer:
    """Whitespace-separated words in, `tokenize`'s tokens out (stop words, long ones gone)."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace())
        .filter(tantivy.Filter.custom_stopword(sorted(STOP_WORDS)))
        .filter(tantivy.Filter.remove_long(MAX_TOKEN_BYTES + 1))  # keeps len < limit bytes
        .build()
    )


def words(text: str) -> str:
    """The lower-cased `\\w+` runs of `text`, space-separated, for `analyzer`."""
    return " ".join(TOKEN_PATTERN.findall(text.lower()))


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("terms", tokenizer_name=ANALYZER, index_option="freq")
    builder.add_unsigned_field("row", fast=True)
    builder.add_text_field("source", tokenizer_name="raw", index_option="basic")
    return builder.build()


class LexicalIndex:
    """A tantivy index of `(row, source, terms)` documents; one writer at a time."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LEXICAL_DIR
        self.path.mkdir(parents=True, exist_ok=True)
        self.schema = _schema()
        self.index = tantivy.Index(self.schema, str(self.path), reuse=True)
        self.index.register_tokenizer(ANALYZER, analyzer())
        self.index.config_reader(reload_policy="Manual")

    def reload(self) -> None:
        """See the last commit of any process."""
        self.index.reload()

    @contextmanager
    def _commit(self) -> Iterator[tantivy.IndexWriter]:
        """A writer whose changes are committed when the block ends, rolled back if it
        raises; the index then sees the commit."""
        writer = self.index.writer(WRITER_HEAP_BYTES, 1)
        try:
            yield writer
            writer.commit()
        except BaseException:
            writer.rollback()
            raise
        finally:
            writer.wait_merging_threads()
        self.index.reload()

    def write(self, sources: Iterable[str], documents: Iterable[Document]) -> None:
        """Delete every document of `sources`, add `documents`, commit (one segment)."""
        with self._commit() as writer:
            for source in sources:
                writer.delete_documents_by_term("source", source)
            self._add(writer, documents)

    def rebuild(self, batches: Iterable[Sequence[Document]]) -> None:
        """Replace the whole index with these documents, in one commit."""
        with self._commit() as writer:
            writer.delete_all_documents()
            for batch in batches:
                self._add(writer, batch)

    @staticmethod
    def _add(writer: tantivy.IndexWriter, documents: Iterable[Document]) -> None:
        for row, source, text in documents:
            document = tantivy.Document()
            document.add_text("terms", words(text))
            document.add_unsigned("row", row)
            document.add_text("source", source)
            writer.add_document(document)

    def _union(self, terms: Sequence[str]) -> tantivy.Query:
        should = tantivy.Occur.Should
        return tantivy.Query.boolean_query(
            [(should, tantivy.Query.term_query(self.schema, "terms", t)) for t in terms]
        )

    def query(self, query: WeightedQuery) -> tantivy.Query | None:
        if query.empty:
            return None
        own = self._union(query.terms) if query.terms else None
        if not query.history_terms:
            return own
        history = tantivy.Query.boost_query(self._union(query.history_terms), query.history_weight)
        if own is None:
            return history
        should = tantivy.Occur.Should
        return tantivy.Query.boolean_query([(should, own), (should, history)])

    def top(self, query: WeightedQuery, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ids and BM25 scores of the best `limit` documents, best first."""
        compiled = self.query(query)
        if compiled is None or limit <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        searcher = self.index.searcher()
        hits = searcher.search(compiled, limit, count=False).hits
        if not hits:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        rows = searcher.fast_field_values("row", [address for _, address in hits])
        return (
            np.asarray(rows, dtype=np.int64),
            np.asarray([score for score, _ in hits], dtype=np.float64),
        )

    def count(self) -> int:
        return int(self.index.searcher().num_docs)
