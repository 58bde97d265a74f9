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
own vector. The text form was chosen by measurement among the forms of
`TEXT_FORMS` in `benchmarks/experiments/rerank_forms.py` (`benchmarks/rerank_query.py`); the
Multi-turn docs give the figures.
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


def conversation_text(query: str, questions: Sequence[str]) -> str:
    """The follow-up, a newline, then the newest of the earlier user questions (`questions`,
    oldest first, blank ones skipped); the follow-up alone when there is none."""
    asked = [q.strip() for q in questions if q.strip()]
    return f"{query}\n{asked[-1]}" if asked else query
