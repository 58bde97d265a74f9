"""The reranker's text forms measured by `benchmarks/rerank_query.py`: the shipped one
(`chatqna.multiturn.rerank_query.conversation_text`) and the alternatives it was chosen
among. The service never runs them.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatqna.multiturn.rerank_query import conversation_text

TEXT_FORMS = ("query", "query_newest", "newest_query", "all_query")


def rerank_text(query: str, questions: Sequence[str], form: str) -> str:
    """The follow-up joined with earlier user questions (`questions`, oldest first) in one
    of `TEXT_FORMS`.

    `query_newest` (the shipped form, `conversation_text`) is the follow-up, a newline, then
    the newest earlier question; `newest_query` puts that question first; `all_query` is
    every earlier question, oldest first, then the follow-up; `query` is the follow-up
    alone. Blank questions are skipped; without any, every form is the follow-up alone.
    """
    if form not in TEXT_FORMS:
        raise ValueError(f"unknown rerank text form {form!r}")
    asked = [q.strip() for q in questions if q.strip()]
    if form == "query" or not asked:
        return query
    if form == "query_newest":
        return conversation_text(query, asked)
    if form == "newest_query":
        return f"{asked[-1]}\n{query}"
    return "\n".join([*asked, query])
