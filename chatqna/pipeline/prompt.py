"""The answer prompt: retrieved passages, the conversation so far, and the user's question.

The question is always the user's raw last message, in their own words; the history is
carried too so the model can resolve "it" and "that". Long histories are cut from the
oldest end to stay within `max_history_chars`.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatqna.documents import ScoredChunk
from chatqna.multiturn.history import Conversation, Message

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


def bounded_history(history: Sequence[Message], max_history_chars: int) -> list[Message]:
    """The most recent messages whose contents fit in `max_history_chars`."""
    kept: list[Message] = []
    used = 0
    for message in reversed(history):
        used += len(message.content)
        if used > max_history_chars:
            break
        kept.append(message)
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
