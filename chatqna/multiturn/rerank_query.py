"""What the reranker scores against on each turn, so that it does not undo the blend.

A reranker that reads only "Which plans include it?" ranks the plans page first whatever
the conversation was about. On a follow-up where the blend ran, the reranker therefore gets
a query that carries the conversation (`MULTI_TURN_RERANK_QUERY=conversation`):

- first turn, stateless turn, blend off: the message and its own vector;
- condense: the standalone rewrite and its vector;
- blended follow-up (`conversation`): `conversation_text` (the follow-up, then the newest
  earlier question) for rerankers that read text, and the blended dense-leg vector for the
  embedding-similarity reranker.

`MULTI_TURN_RERANK_QUERY=message` keeps the seeds' behaviour: the isolated follow-up and its
own vector. The text form was chosen by measurement among the forms of `TEXT_FORMS`
(`benchmarks/rerank_query.py`); the Multi-turn docs give the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KIND_MESSAGE = "message"
KIND_STANDALONE = "standalone"
KIND_CONVERSATION = "conversation"


@dataclass(frozen=True)
class RerankQuery:
    """The reranker's query for one turn: its text, its vector and which kind it is."""

    text: str
    vector: np.ndarray | None
    kind: str


def conversation_text(query: str, questions: Sequence[str], form: str = "query_newest") -> str:
    """The follow-up joined with earlier user questions (`questions`, oldest first).

    Forms: `query_newest` (the shipped one) is the follow-up, a newline, then the newest
    earlier question; `newest_query` puts that question first; `all_query` is every earlier
    question, oldest first, then the follow-up; `query` is the follow-up alone.
    """
    asked = [q.strip() for q in questions if q.strip()]
    if form == "query" or not asked:
        return query
    if form == "query_newest":
        return f"{query}\n{asked[-1]}"
    if form == "newest_query":
        return f"{asked[-1]}\n{query}"
    if form == "all_query":
        return "\n".join([*asked, query])
    raise ValueError(f"unknown rerank text form {form!r}")


TEXT_FORMS = ("query", "query_newest", "newest_query", "all_query")
