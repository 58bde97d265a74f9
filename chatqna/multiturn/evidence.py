"""The previous answer as evidence for the BM25 leg: its few most informative terms.

An answer names what the conversation is about in the corpus's own words, so its rarest
terms can steer the lexical leg of the next turn. `answer_terms` takes the newest assistant
message of the history, drops the terms the follow-up or the earlier questions already
give, and keeps the `limit` terms of highest inverse document frequency (terms the corpus
does not hold carry no evidence and are left out). The BM25 leg then scores them as it
scores the earlier questions' words, weighted by their IDF.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from chatqna.multiturn.history import Conversation

ANSWER_TERMS = 5

Tokenizer = Callable[[str], list[str]]
Idf = Callable[[str], float | None]


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
