"""Blend mode: steer the dense search with the conversation, at the cost of one batched call.

    V = normalise(a * EQ + (1 - a) * EH)

`EQ` embeds the latest user message, `EH` the history text, `a` is
`MULTI_TURN_BLEND_ALPHA`. Both are embedded in ONE batched call (`[query, history]`, and
the previous question for the self-contained check below; on TEI that is one
`POST /v1/embeddings`). `V` drives the dense leg; BM25 keeps the isolated query
text (plus the earlier questions, below), and the reranker's query is built from the
conversation (`chatqna.multiturn.rerank_query`).

History text: the last `MULTI_TURN_HISTORY_TURNS` messages of the chosen roles before the
query (`MULTI_TURN_HISTORY_ROLES`: user and assistant, or the user's only), normalised to
English, one message per line, most recent first or oldest first
(`MULTI_TURN_HISTORY_ORDER`), each cut to its first `MESSAGE_CHARS` (800) characters. A chat
UI sends the service's whole answers back, up to `LLM_MAX_TOKENS` long; uncut, the latest
answer would fill an embedder's input limit (256 tokens for the embedded MiniLM) and push
the previous question out of the history vector. 800 characters also keep the history to
what the benchmark's own-history replay measures (`chatqna.evaluation.live`). When the blend
cannot run (the flag is off, there is no history, the history holds no user question (a UI's
greeting), or the window is 0) the turn takes the baseline path: one single-string embedding
call, and a log line says why.

A blended follow-up's BM25 leg may also hear the conversation: `earlier_questions` gives the
user's earlier questions (the `BM25_HISTORY_QUESTIONS` most recent ones), whose content words
the BM25 query adds at `MULTI_TURN_BM25_HISTORY_WEIGHT`. All earlier questions, not only
the blend's window: the first question usually names the topic (on ClapNQ, more questions
scored better, up to all of them); the cap bounds the cost of very long chats.

A follow-up that already says what the previous question said is searched on its own:
with `MULTI_TURN_SELF_CONTAINED_SIMILARITY` above 0, the same batched call also embeds the
newest earlier user question, and when the follow-up's cosine with it reaches the threshold
the blend does not run (`self_contained`): the turn ranks exactly as stateless. On MTRAG
the blend helped the follow-ups least like the previous question ("Can you elaborate?")
and hurt the most alike, which name their subject and are only dragged towards the
previous turn's passages.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chatqna.backends.protocols import Embedder
from chatqna.backends.vectors import l2_normalise
from chatqna.multiturn.history import Conversation, Message
from chatqna.multiturn.translate import HistoryTranslator, TranslationOutcome, TranslationReport

logger = logging.getLogger(__name__)

SKIP_DISABLED = "disabled"
SKIP_NO_HISTORY = "no_history"
SKIP_WINDOW_ZERO = "history_turns_zero"
SKIP_SELF_CONTAINED = "self_contained"
BM25_HISTORY_QUESTIONS = 8
MESSAGE_CHARS = 800


def earlier_questions(
    conversation: Conversation, limit: int = BM25_HISTORY_QUESTIONS
) -> tuple[str, ...]:
    """The last `limit` user questions before the query, oldest first, blank ones skipped."""
    if limit <= 0:
        return ()
    asked = [m.content.strip() for m in conversation.history if m.role == "user"]
    return tuple(q for q in asked if q)[-limit:]


def history_text(messages: Sequence[Message], order: str) -> str:
    """The documented history assembly: message contents, one per line, oldest first
    (`chronological`) or most recent first (`newest_first`, so that an embedder which
        truncates long input keeps the most recent messages), each cut to `MESSAGE_CHARS`."""
    lines = [m.content.strip()[:MESSAGE_CHARS].rstrip() for m in messages if m.content.strip()]
    return "\n".join(reversed(lines) if order == "newest_first" else lines)


def blend_vectors(query: np.ndarray, history: np.ndarray, alpha: float) -> np.ndarray:
    """`normalise(alpha * query + (1 - alpha) * history)` for two vectors of equal length."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must be within [0, 1]")
    mixed = alpha * np.asarray(query, dtype=np.float32) + (1.0 - alpha) * np.asarray(
        history, dtype=np.float32
    )
    blended: np.ndarray = l2_normalise(mixed.reshape(1, -1))[0]
    return blended


def role_texts(messages: Sequence[Message], order: str) -> list[tuple[str, str]]:
    """`separate` roles: the window's user messages and its assistant messages as two
    history texts (each assembled like `history_text`), empty sides left out."""
    texts = []
    for role in ("user", "assistant"):
        text = history_text([m for m in messages if m.role == role], order)
        if text:
            texts.append((role, text))
    return texts


def mix_roles(vectors: dict[str, np.ndarray], assistant_weight: float) -> np.ndarray:
    """The history vector of `separate` roles: `normalise((1 - w) * EU + w * EA)` with `w`
    the assistant messages' share (a missing side leaves its share to the other)."""
    if "user" in vectors and "assistant" in vectors:
        user = np.asarray(vectors["user"], dtype=np.float32)
        mixed = (1.0 - assistant_weight) * user + assistant_weight * vectors["assistant"]
        history: np.ndarray = l2_normalise(mixed.reshape(1, -1))[0]
        return history
    return next(iter(vectors.values()))


@dataclass(frozen=True)
class BlendResult:
    """The dense-leg vector of a turn and the record of how it was made."""

    embedding: np.ndarray
    query_embedding: np.ndarray
    executed: bool
    reason: str
    alpha: float
    history_turns: int
    history_messages: int = 0
    history: str = ""
    translation: TranslationReport | None = None
    order: str = "chronological"
    roles: str = "user_assistant"
    question_similarity: float | None = None
    # (original, English) for each window message the translator changed, so that the BM25
    # leg and the reranker hear the history in the same words as the embedding.
    english: tuple[tuple[str, str], ...] = ()

    def in_english(self, text: str) -> str:
        """`text` as the blend embedded it: its translation when the window held it."""
        return dict(self.english).get(text.strip(), text)


def previous_question(conversation: Conversation, window: Sequence[Message]) -> str:
    """The newest earlier user question: as the window holds it (translated) when it is
    there, else as asked; empty when the user has asked nothing before."""
    for messages in (window, conversation.history):
        asked = [m.content.strip() for m in messages if m.role == "user" and m.content.strip()]
        if asked:
            return asked[-1]
    return ""


def translated_pairs(
    window: Sequence[Message], normalised: Sequence[Message]
) -> tuple[tuple[str, str], ...]:
    """(original, English) for each window message that translation changed."""
    return tuple(
        (before.content.strip(), after.content.strip())
        for before, after in zip(window, normalised, strict=True)
        if before.content != after.content
    )


def question_similarity(query: np.ndarray, question: np.ndarray) -> float:
    """The cosine of the query's and the previous question's embeddings."""
    pair = l2_normalise(np.asarray([query, question], dtype=np.float32))
    return float(pair[0] @ pair[1])


def _skip_reason(enabled: bool, history_turns: int, window: Sequence[Message]) -> str | None:
    if not enabled:
        logger.debug("blend not run: MULTI_TURN_BLEND_ENABLED is false")
        return SKIP_DISABLED
    # The window is empty for a greeting alone too (`Conversation.window`).
    skip = SKIP_WINDOW_ZERO if history_turns == 0 else SKIP_NO_HISTORY if not window else None
    if skip is not None:
        logger.info("blend not run (%s): one single-string embedding call", skip)
    return skip


def _self_contained(similarity: float | None, threshold: float) -> bool:
    """Whether the query's similarity to the previous question reaches `threshold`."""
    if similarity is None or similarity < threshold:
        return False
    logger.info(
        "blend not run (%s): similarity %.2f to the previous question, at least %.2f",
        SKIP_SELF_CONTAINED,
        similarity,
        threshold,
    )
    return True


async def blend_query(
    conversation: Conversation,
    embedder: Embedder,
    *,
    enabled: bool,
    alpha: float,
    history_turns: int,
    translator: HistoryTranslator | None,
    order: str,
    roles: str,
    assistant_weight: float,
    self_contained: float,
) -> BlendResult:
    """Embed the turn's query, blended with its history when the blend can run. With
    `roles="separate"` the user's and the assistant's messages are two inputs of the
    same batched call (`[query, user messages, assistant messages]`), mixed by
    `assistant_weight` into the history vector. With `self_contained` above 0 the call also
    embeds the previous user question; a query at least that alike to it is not blended."""
    window = conversation.window(history_turns, roles)
    skip = _skip_reason(enabled, history_turns, window)
    outcome = TranslationOutcome(tuple(window))
    if skip is None and translator is not None:
        outcome = await translator.normalise(window)
    parts = (
        role_texts(outcome.messages, order)
        if roles == "separate"
        else [("history", history_text(outcome.messages, order))]
    )
    parts = [(role, text) for role, text in parts if text]
    if skip is None and not parts:
        skip = SKIP_NO_HISTORY
        logger.info("blend not run (%s): the history window holds no text", skip)
    if skip is not None:
        vector = (await embedder.embed([conversation.query]))[0]
        return BlendResult(
            vector, vector, False, skip, alpha, history_turns, order=order, roles=roles
        )
    asked = previous_question(conversation, outcome.messages) if self_contained > 0.0 else ""
    inputs = [conversation.query, *(text for _, text in parts)]
    vectors = await embedder.embed([*inputs, asked] if asked else inputs)
    similarity = question_similarity(vectors[0], vectors[len(inputs)]) if asked else None
    executed = not _self_contained(similarity, self_contained)
    history = mix_roles(
        {role: vectors[i + 1] for i, (role, _) in enumerate(parts)}, assistant_weight
    )
    return BlendResult(
        embedding=blend_vectors(vectors[0], history, alpha) if executed else vectors[0],
        query_embedding=vectors[0],
        executed=executed,
        reason="executed" if executed else SKIP_SELF_CONTAINED,
        alpha=alpha,
        history_turns=history_turns,
        history_messages=len(window),
        history="\n".join(text for _, text in parts) if executed else "",
        translation=outcome.report(translator is not None),
        order=order,
        roles=roles,
        question_similarity=similarity,
        english=translated_pairs(window, outcome.messages),
    )
