r"""The BM25 query both lexical legs run: the shared tokeniser and the weighted query tree.

Documents and queries are tokenised alike (`tokenize`): lower-cased `\w+` words without
stop words or over-long tokens, so the embedded index (tantivy, `chatqna.retrieval.embedded.
lexical`) and Redis (RediSearch's `BM25STD`, `chatqna.retrieval.redis`) see the same tokens.

A query is a union of terms. A follow-up's query adds the content words of the earlier
questions as a second, weighted union (`WeightedQuery`). A union's score is the sum of its
children's scores, in order, times its weight. Unions are kept to `FANOUT` children by
nesting the overflow as the last child (`query_tree`), because RediSearch adds the children
of a wider union in an order that depends on its iterator heap; the tests' reference model of
RediSearch's scorer (`tests/oracles/redisearch_bm25.py`) walks the same tree, so the two add
in the same order.

A text with more than `MAX_QUERY_TERMS` distinct terms (a pasted page) keeps its most
informative ones (`informative_terms`), and so does the history: the tree's depth, and with
it RediSearch's parser stack, stays bounded for any message the API accepts.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

TOKEN_PATTERN = re.compile(r"\w+", re.UNICODE)
# RediSearch cannot match a term longer than 128 bytes; no word is that long, and dropping
# such tokens (hashes, base64) from both indexes keeps passage lengths identical.
MAX_TOKEN_BYTES = 64
FANOUT = 8
# Distinct terms a query (and, apart, its history) keeps: more than any question has, and
# few enough that the tree nests at most 20 unions deep, where RediSearch's query parser
# overflows its stack ("Parser stack overflow") past about 80.
MAX_QUERY_TERMS = 128

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
    """Lower-cased word tokens without stop words (and without absurdly long tokens)."""
    # A character is at most 4 bytes: only longer tokens need measuring.
    return [
        t
        for t in TOKEN_PATTERN.findall(text.lower())
        if t not in STOP_WORDS
        and (len(t) <= MAX_TOKEN_BYTES // 4 or len(t.encode("utf-8")) <= MAX_TOKEN_BYTES)
    ]


# Texts up to this many characters (a question, a line of an earlier one) have their terms
# remembered, in an LRU cache of `_CACHED_TEXTS` entries. An entry holds the text and its terms
# joined into one string, so each stays under about 2.5 KiB whatever the characters and the
# whole cache under about 10 MiB; a longer text is tokenised on each turn.
_CACHED_TEXT_CHARS = 256
_CACHED_TEXTS = 4096


@functools.lru_cache(maxsize=_CACHED_TEXTS)
def _joined_terms(text: str) -> str:
    # Tokens are runs of word characters, so a space separates them unambiguously.
    return " ".join(dict.fromkeys(tokenize(text)))


def _line_terms(text: str) -> list[str]:
    """The distinct tokens of a query-side text, in first-seen order (cached when short)."""
    if len(text) > _CACHED_TEXT_CHARS:
        return list(dict.fromkeys(tokenize(text)))
    joined = _joined_terms(text)
    return joined.split(" ") if joined else []


def informative_terms(
    terms: Sequence[str], text: str, limit: int = MAX_QUERY_TERMS
) -> tuple[str, ...]:
    """At most `limit` of `terms` (the distinct tokens of `text`), in their order.

    When there are more, the ones kept are those `text` repeats most (stop words are gone,
    so a long text's most frequent tokens are its topic), ties going to the longer token
    (longer words are the rarer ones, which BM25's IDF weighs most) and then to the earlier.
    The rule reads the text alone, so both lexical legs keep the same terms without asking
    either index for its statistics, as Lucene's MoreLikeThis caps its query at the best
    `maxQueryTerms` (25) by tf-idf.
    """
    if len(terms) <= limit:
        return tuple(terms)
    counts = Counter(tokenize(text))
    rank = {t: (-counts[t], -len(t), at) for at, t in enumerate(terms)}
    kept = set(sorted(terms, key=rank.__getitem__)[:limit])
    return tuple(t for t in terms if t in kept)


@dataclass(frozen=True)
class WeightedQuery:
    """The BM25 query of a turn: its own terms at weight 1, earlier questions' at a lower one.

    Terms are unique and keep their first-seen order; a history term the query already
    holds counts once, at weight 1. `parse` keeps at most `MAX_QUERY_TERMS` of each
    (`informative_terms`).
    """

    terms: tuple[str, ...]
    history_terms: tuple[str, ...] = ()
    history_weight: float = 0.0

    @classmethod
    def parse(cls, text: str, history: str = "", history_weight: float = 0.0) -> WeightedQuery:
        every = _line_terms(text)
        terms = informative_terms(every, text)
        if history_weight <= 0.0:
            return cls(terms)
        # A query term the cap left out is not brought back at the history's weight.
        seen = set(every)
        # Line by line (no token spans a line break): the earlier questions of a chat come
        # back turn after turn, and their tokens are remembered.
        extra = [t for line in history.split("\n") for t in _line_terms(line) if t not in seen]
        unique = informative_terms(tuple(dict.fromkeys(extra)), history)
        return cls(terms, unique, history_weight if unique else 0.0)

    @property
    def empty(self) -> bool:
        return not self.terms and not self.history_terms


@dataclass(frozen=True)
class TermUnion:
    """A node of the query tree: the sum of its children's scores, in order, times `weight`."""

    children: tuple[str | TermUnion, ...]
    weight: float = 1.0


def _chain(terms: Sequence[str], room: int) -> tuple[str | TermUnion, ...]:
    if len(terms) <= room:
        return tuple(terms)
    return (*terms[: room - 1], TermUnion(_chain(terms[room - 1 :], FANOUT)))


def query_tree(query: WeightedQuery) -> TermUnion | None:
    """The union tree both retrievers score; None when the query has no term at all.

    A weighted union needs two children to keep its weight in RediSearch (a one-term group
    becomes a plain term, weight lost), so a single history term is listed twice at half
    the weight: `(t + t) * w / 2` is exactly `t * w` in floating point.
    """
    if query.empty:
        return None
    if not query.history_terms:
        return TermUnion(_chain(query.terms, FANOUT))
    if len(query.history_terms) == 1:
        term = query.history_terms[0]
        history = TermUnion((term, term), query.history_weight / 2)
    else:
        history = TermUnion(_chain(query.history_terms, FANOUT), query.history_weight)
    if not query.terms:
        return history
    return TermUnion((*_chain(query.terms, FANOUT - 1), history))
