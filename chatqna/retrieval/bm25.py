"""Okapi BM25 over an in-memory inverted index, and the tokeniser both retrievers share.

Robertson and Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond" (2009):
`idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))` with
`idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))` (the non-negative variant Lucene uses).
`k1 = 1.2`, `b = 0.75` are the customary defaults.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

TOKEN_PATTERN = re.compile(r"\w+", re.UNICODE)

# Function words that carry no topic; dropping them keeps a question like "how long do I
# have?" from matching every passage on "how" and "do".
_STOP_WORD_TEXT = """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves"""
STOP_WORDS = frozenset(_STOP_WORD_TEXT.split())


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without stop words."""
    return [t for t in TOKEN_PATTERN.findall(text.lower()) if t not in STOP_WORDS]


class BM25Index:
    """An immutable BM25 index over a list of documents, addressed by position."""

    def __init__(self, documents: Sequence[str], *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self._postings: dict[str, list[tuple[int, int]]] = {}
        self._lengths: list[int] = []
        for position, text in enumerate(documents):
            counts = Counter(tokenize(text))
            self._lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                self._postings.setdefault(term, []).append((position, tf))
        self._count = len(documents)
        self._avg_length = (sum(self._lengths) / self._count) if self._count else 0.0

    def __len__(self) -> int:
        return self._count

    def idf(self, term: str) -> float:
        df = len(self._postings.get(term, ()))
        return math.log(1.0 + (self._count - df + 0.5) / (df + 0.5))

    def scores(self, query_terms: Sequence[str]) -> dict[int, float]:
        """BM25 score of every document matching at least one query term."""
        totals: dict[int, float] = {}
        avg = self._avg_length or 1.0
        for term in set(query_terms):
            postings = self._postings.get(term)
            if not postings:
                continue
            idf = self.idf(term)
            for position, tf in postings:
                norm = self.k1 * (1.0 - self.b + self.b * self._lengths[position] / avg)
                gain = idf * tf * (self.k1 + 1) / (tf + norm)
                totals[position] = totals.get(position, 0.0) + gain
        return totals

    def top(
        self, query: str, k: int, history: str = "", history_weight: float = 0.0
    ) -> list[tuple[int, float]]:
        """The `k` best `(position, score)` pairs for a query text; ties by position.

        With `history` and a positive `history_weight`, the history's terms that the query
        does not already hold are added at that weight (query terms weigh 1).
        """
        weights = query_term_weights(query, history, history_weight)
        scored = self.weighted_scores(weights)
        return sorted(scored.items(), key=lambda pair: (-pair[1], pair[0]))[:k]

    def weighted_scores(self, weights: dict[str, float]) -> dict[int, float]:
        """Sum over terms of `weight * BM25(term)`, for every document matching a term."""
        totals: dict[int, float] = {}
        for term, weight in weights.items():
            for position, score in self.scores([term]).items():
                totals[position] = totals.get(position, 0.0) + weight * score
        return totals


def query_term_weights(
    query: str, history: str = "", history_weight: float = 0.0
) -> dict[str, float]:
    """Query terms at weight 1; history terms not in the query at `history_weight`."""
    weights = dict.fromkeys(tokenize(query), 1.0)
    if history_weight > 0.0:
        for term in tokenize(history):
            weights.setdefault(term, history_weight)
    return weights
