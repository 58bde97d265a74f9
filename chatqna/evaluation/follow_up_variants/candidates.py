"""Mechanisms measured as candidates against the shipped blend, not run by the service.

The benchmark (`chatqna.evaluation.modes`, `benchmarks/follow_up_selection.py`) plans
follow-ups with them to see whether they beat what ships; the Multi-turn docs give the
figures. None of them is reachable from a setting.

- An adaptive alpha: `content_word_alpha` (from how much the follow-up says on its own) and
  `top_score_alpha` (from how sure its own best dense hit is), each in place of the fixed
  `MULTI_TURN_BLEND_ALPHA`.
- The previous answer as evidence for the BM25 leg (`answer_terms`): an answer names what
  the conversation is about in the corpus's own words, so its rarest terms can steer the
  lexical leg of the next turn. It takes the newest assistant message of the history,
  drops the terms the follow-up or the earlier questions already give, and keeps the
  `limit` terms of highest inverse document frequency (terms the corpus does not hold
  carry no evidence and are left out). The BM25 leg then scores them as it scores the
  earlier questions' words, weighted by their IDF (`corpus_idf`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from chatqna.multiturn.history import Conversation
from chatqna.retrieval.query import tokenize

ALPHA_HALF_WORDS = 1.5
TYPICAL_TOP_SCORE = 0.57
ANSWER_TERMS = 5

Tokenizer = Callable[[str], list[str]]
Idf = Callable[[str], float | None]


# --- an adaptive alpha -----------------------------------------------------------------
def content_word_alpha(content_words: int, half: float = ALPHA_HALF_WORDS) -> float:
    """The adaptive alpha: `w / (w + half)` for a follow-up of `w` distinct content words.

    A follow-up that says more on its own weighs more in the blend: with `half` words the
    query and the history weigh the same, a message without content words ("and then?")
    searches with the history alone, and the weight nears 1 as the message grows. The
    default `half` (1.5) gives the fixed alpha 0.7 to a follow-up of 3-4 content words."""
    if content_words < 0 or half <= 0.0:
        raise ValueError("content_words must be >= 0 and half > 0")
    return content_words / (content_words + half)


def top_score_alpha(top_score: float, alpha: float, typical: float = TYPICAL_TOP_SCORE) -> float:
    """The adaptive alpha from how sure the follow-up's own best hit is: the fixed `alpha`,
    moved up by as much as the follow-up's dense top-1 cosine (searched alone) exceeds
    `typical`, the median of that cosine over follow-ups, or down by as much as it falls
    short; within [0, 1]."""
    return min(1.0, max(0.0, alpha + top_score - typical))


# --- the previous answer as BM25 evidence ----------------------------------------------
def previous_answer(conversation: Conversation) -> str:
    """The newest assistant message before the query ("" when there is none)."""
    for message in reversed(conversation.history):
        if message.role == "assistant" and message.content.strip():
            return message.content
    return ""


def informative_terms(
    tokens: Iterable[str], idf: Idf, exclude: Iterable[str], limit: int
) -> tuple[str, ...]:
    """The `limit` distinct tokens of highest IDF (ties: first seen first), without
    `exclude` and without tokens the corpus does not hold (`idf` returns None)."""
    if limit <= 0:
        return ()
    seen = set(exclude)
    scored: list[tuple[float, int, str]] = []
    for position, token in enumerate(dict.fromkeys(tokens)):
        value = None if token in seen else idf(token)
        if value is not None:
            scored.append((-value, position, token))
    return tuple(token for _, _, token in sorted(scored)[:limit])


def answer_terms(
    conversation: Conversation,
    tokenize: Tokenizer,
    idf: Idf,
    questions: Iterable[str] = (),
    limit: int = ANSWER_TERMS,
) -> tuple[str, ...]:
    """The previous answer's `limit` most informative terms that neither the follow-up nor
    the earlier `questions` already hold."""
    answer = previous_answer(conversation)
    if not answer:
        return ()
    known = tokenize(conversation.query) + [t for q in questions for t in tokenize(q)]
    return informative_terms(tokenize(answer), idf, known, limit)


def corpus_idf(texts: Sequence[str]) -> Idf:
    """The inverse document frequency of a term over `texts` (as the BM25 leg tokenises
    them), `ln(1 + (N - df + 0.5) / (df + 0.5))`; None for a term no text holds."""
    frequencies = Counter(term for text in texts for term in set(tokenize(text)))
    total = len(texts)

    def idf(term: str) -> float | None:
        df = frequencies.get(term)
        return None if not df else math.log(1.0 + (total - df + 0.5) / (df + 0.5))

    return idf
