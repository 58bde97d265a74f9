"""An automatic judge of whether a rewrite stands alone, so prompt changes can be compared.

A rewrite of a follow-up is judged **standalone** when all three hold:

1. the rewrite succeeded (it passed the condense output guard);
2. it holds no reference word that needs the conversation to resolve: `it`, `its`, `that`,
   `this`, `these`, `those`, `they`, `them`, `their`, `there`, `one`, `ones`, `same`,
   `other`, `else` (whole words, any case);
3. it restores the subject: at least one content word (the BM25 tokeniser's, stop words
   removed) that the dataset's reference rewrite adds to the raw message also appears in the
   rewrite. When the reference adds no content word (the message already stood alone), this
   holds trivially.
"""

from __future__ import annotations

import re

from chatqna.retrieval.query import tokenize

REFERENCE_WORDS = frozenset(
    "it its that this these those they them their there one ones same other else".split()
)
_WORDS = re.compile(r"[a-z']+")


def reference_words(text: str) -> list[str]:
    return [w for w in _WORDS.findall(text.lower()) if w in REFERENCE_WORDS]


def judge_standalone(rewrite: str | None, raw: str, reference: str) -> tuple[bool, str]:
    """`(verdict, why)` for one rewrite; `rewrite=None` means the rewrite failed."""
    if rewrite is None:
        return False, "rewrite failed"
    unresolved = reference_words(rewrite)
    if unresolved:
        return False, f"unresolved reference: {', '.join(sorted(set(unresolved)))}"
    added = set(tokenize(reference)) - set(tokenize(raw))
    if added and not added & set(tokenize(rewrite)):
        return False, "subject not restored"
    return True, "standalone"
