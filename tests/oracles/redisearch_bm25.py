"""A reference model of RediSearch's `BM25STD` scorer, the oracle the Redis tests check against.

For a term `t` and a passage `d` of `len(d)` tokens, in an index of `N` passages of average
length `avg_len`, `df` of which hold `t`, `f` times in `d`:

    score(t, d) = idf(t) * f * (k1 + 1) / (f + k1 * (1 - b + b * len(d) / avg_len))
    idf(t)      = ln(1 + (N - df + 0.5) / (df + 0.5))

with `k1 = 1.2` and `b = 0.5` (Robertson and Zaragoza, "The Probabilistic Relevance Framework:
BM25 and Beyond", 2009; `b = 0.5` is RediSearch's choice). `BM25Index` evaluates it the way
RediSearch 2.10 does: `k1` is a single-precision constant, the ratio inside the idf's
logarithm is computed in single precision, and the products run left to right, so its scores
are bit-for-bit those of a Redis index over the same passages (ties go to the smaller passage
id). It tokenises and walks the query tree of `chatqna.retrieval.query`, as the product does.
The product never scores with it: the embedded index scores with tantivy, Redis with
RediSearch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from chatqna.retrieval.query import TermUnion, WeightedQuery, query_tree, tokenize

K1 = float(np.float32(1.2))  # RediSearch: `static const float k1 = 1.2`
K1_PLUS_ONE = float(np.float32(1.2) + np.float32(1.0))
B = 0.5


def bm25_idf(total: int, containing: int) -> float:
    """RediSearch's `CalculateIDF_BM25`: the ratio in single precision, the log in double."""
    f32 = np.float32
    ratio = f32(1.0) + (f32(max(total, containing) - containing) + f32(0.5)) / (
        f32(containing) + f32(0.5)
    )
    return math.log(float(ratio))


class BM25Index:
    """An immutable BM25 index over a list of documents, addressed by position.

    `keys` (the passage ids) order tied scores; without them, positions do. Per-term
    scores are computed on first use and cached: the index never changes after it is built.
    """

    def __init__(self, documents: Sequence[str], keys: Sequence[str] | None = None) -> None:
        if keys is not None and len(keys) != len(documents):
            raise ValueError("one key per document is required")
        postings: dict[str, tuple[list[int], list[int]]] = {}
        lengths = np.zeros(len(documents), dtype=np.float64)
        for position, text in enumerate(documents):
            counts = Counter(tokenize(text))
            lengths[position] = sum(counts.values())
            for term, tf in counts.items():
                rows, freqs = postings.setdefault(term, ([], []))
                rows.append(position)
                freqs.append(tf)
        self._postings = {
            term: (np.asarray(rows, dtype=np.intp), np.asarray(freqs, dtype=np.int32))
            for term, (rows, freqs) in postings.items()
        }
        self._lengths = lengths
        self._count = len(documents)
        self._avg_length = float(lengths.sum()) / self._count if self._count else 0.0
        order = np.arange(self._count) if keys is None else np.argsort(np.asarray(keys))
        self._tie_rank = np.empty(self._count, dtype=np.int64)
        self._tie_rank[order] = np.arange(self._count)
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return self._count

    def idf(self, term: str) -> float:
        postings = self._postings.get(term)
        return bm25_idf(self._count, 0 if postings is None else len(postings[0]))

    def term_scores(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(positions, scores) of the documents holding `term`, positions ascending."""
        cached = self._cache.get(term)
        if cached is not None:
            return cached
        postings = self._postings.get(term)
        if postings is None:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float64)
        rows, counts = postings
        tf = counts.astype(np.float64)
        # Left to right, as RediSearch evaluates `idf * f * (k1 + 1) / (...)`.
        norm = tf + K1 * ((1.0 - B) + (B * self._lengths[rows]) / self._avg_length)
        scores = self.idf(term) * tf * K1_PLUS_ONE / norm
        self._cache[term] = (rows, scores)
        return rows, scores

    def _sums(self, node: TermUnion) -> np.ndarray:
        """Every document's score for a union: its children added in order, then weighted.

        The terms come first (`query_tree` nests only after them): `bincount` adds each
        document's term scores in input order, starting from 0.0, and nested unions are then
        added one by one. Adding 0.0 for a child a document lacks is exact, so the result is
        bit for bit RediSearch's sum over the children the document matched.
        """
        rows: list[np.ndarray] = []
        scores: list[np.ndarray] = []
        nested: list[TermUnion] = []
        for child in node.children:
            if isinstance(child, TermUnion):
                nested.append(child)
            elif nested:
                raise ValueError("a union's terms must precede its nested unions")
            else:
                term_rows, term_scores = self.term_scores(child)
                rows.append(term_rows)
                scores.append(term_scores)
        if len(rows) == 1:
            sums = np.bincount(rows[0], weights=scores[0], minlength=self._count)
        elif rows:
            every = np.concatenate(rows)
            sums = np.bincount(every, weights=np.concatenate(scores), minlength=self._count)
        else:
            sums = np.zeros(self._count, dtype=np.float64)
        if sums.dtype != np.float64:  # bincount of no rows at all counts in integers
            sums = sums.astype(np.float64)
        for child in nested:
            sums += self._sums(child)
        if node.weight != 1.0:
            np.multiply(sums, node.weight, out=sums)
        return sums

    def _node(self, node: TermUnion) -> tuple[np.ndarray, np.ndarray]:
        sums = self._sums(node)
        # Every matching term scores above zero (idf and f are positive), so a document
        # matches exactly when its sum is not zero.
        matched = sums.nonzero()[0]  # 1-D: cheaper than np.flatnonzero
        return matched, sums[matched]

    def scores(self, query: WeightedQuery) -> dict[int, float]:
        """BM25 score of every document matching at least one term of the query."""
        tree = query_tree(query)
        if tree is None or not self._count:
            return {}
        rows, values = self._node(tree)
        return dict(zip(rows.tolist(), values.tolist(), strict=True))

    def top(self, query: WeightedQuery, k: int) -> list[tuple[int, float]]:
        """The `k` best `(position, score)` pairs; ties go to the smaller key."""
        tree = query_tree(query)
        if tree is None or k <= 0 or not self._count:
            return []
        rows, values = self._node(tree)
        if len(rows) > k:
            # Only scores at or above the k-th best can make the cut; sort just those.
            kth = np.partition(values, len(values) - k)[len(values) - k]
            keep = values >= kth
            rows, values = rows[keep], values[keep]
        order = np.lexsort((self._tie_rank[rows], -values))[:k]
        return [(int(rows[i]), float(values[i])) for i in order]
