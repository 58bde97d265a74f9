"""The answer prompt: retrieved passages, the conversation so far, and the user's question.

The question is always the user's raw last message, in their own words; the history is
carried too so the model can resolve "it" and "that". Long histories are cut from the
oldest end to stay within `max_history_chars`; the message where the cut falls is shortened
(its start kept), and the previous user question is always kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatqna.documents import ScoredChunk
from chatqna.multiturn.history import Conversation, Message, shortened

# A shortened older message keeps at least this much, or is left out.
MIN_KEPT_CHARS = 200

SYSTEM_PROMPT = (
    "You are a helpful support assistant. Answer the user's question using only the "
    "numbered passages from the knowledge base below. If the passages do not contain the "
    "answer, say that you do not know. Be concise and mention the source file you used."
)


def format_passages(sources: Sequence[ScoredChunk]) -> str:
    if not sources:
        return "(no passages were found)"
    blocks = []
    for number, item in enumerate(sources, start=1):
        chunk = item.chunk
        heading = f"[{number}] {chunk.source}" + (f" - {chunk.title}" if chunk.title else "")
        blocks.append(f"{heading}\n{chunk.text.strip()}")
    return "\n\n".join(blocks)


def _last_question(history: Sequence[Message]) -> int | None:
    asked = [index for index, message in enumerate(history) if message.role == "user"]
    return asked[-1] if asked else None


def bounded_history(history: Sequence[Message], max_history_chars: int) -> list[Message]:
    """The most recent messages whose contents fit in `max_history_chars`.

    The message that does not fit is shortened (its start kept, the cut marked) rather
    than ending the history there, unless less than `MIN_KEPT_CHARS` of it would be left.
    The previous user question, and what came after it, are always kept: a long last
    answer is shortened to leave the question room (half the budget at most), since the
    question is what "it" and "that" in the new one refer to."""
    question = _last_question(history)
    kept: list[Message] = []
    room = max_history_chars
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        protected = question is not None and index >= question
        reserve = 0
        if question is not None and index > question:
            reserve = min(len(history[question].content), room // 2)
        limit = room - reserve
        if len(message.content) > limit:
            if not protected and limit < MIN_KEPT_CHARS:
                break
            message = shortened(message, max(limit, MIN_KEPT_CHARS))
        kept.append(message)
        room -= len(message.content)
        if not protected and message is not history[index]:
            break  # an older message was shortened: the budget is spent
    return list(reversed(kept))


def build_answer_prompt(
    conversation: Conversation,
    sources: Sequence[ScoredChunk],
    *,
    max_history_chars: int = 6000,
) -> list[dict[str, str]]:
    """OpenAI-style messages for the answer LLM."""
    system = SYSTEM_PROMPT
    if conversation.system:
        system = "\n\n".join((*conversation.system, system))
    messages = [{"role": "system", "content": f"{system}\n\nPassages:\n{format_passages(sources)}"}]
    messages.extend(m.as_openai() for m in bounded_history(conversation.history, max_history_chars))
    messages.append({"role": "user", "content": conversation.query})
    return messages
