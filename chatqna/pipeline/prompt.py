"""The answer prompt: retrieved passages, the conversation so far, and the user's question.

The question is always the user's raw last message, in their own words; the history is
carried too so the model can resolve "it" and "that". Long histories are cut from the
oldest end to stay within `max_history_chars` in total; the message where the cut falls is
shortened (its start kept), and the previous user question and the latest answer are always
kept, shortened to fit if need be.
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


def _newest_first(
    messages: Sequence[Message], room: int, *, keep_newest: bool
) -> tuple[list[Message], int]:
    """`messages` newest first while `room` lasts, and the room left. The message that
    overflows is shortened and ends the run, or is left out when less than
    `MIN_KEPT_CHARS` of it would be kept; with `keep_newest` the newest one is shortened
    to the room there is, however little."""
    kept: list[Message] = []
    for position, message in enumerate(reversed(messages)):
        if room <= 0:
            break
        protected = keep_newest and position == 0
        overflows = len(message.content) > room
        if overflows and not protected and room < MIN_KEPT_CHARS:
            break
        kept.append(shortened(message, room))
        room -= len(kept[-1].content)
        if overflows and not protected:
            break  # an older message was shortened: the budget is spent
    return kept, room


def bounded_history(history: Sequence[Message], max_history_chars: int) -> list[Message]:
    """The most recent messages whose contents fit in `max_history_chars` in total.

    The message that does not fit is shortened (its start kept, the cut marked) rather
    than ending the history there, unless less than `MIN_KEPT_CHARS` of it would be left.
    The previous user question and the latest answer are always kept, shortened if need
    be: the answer leaves the question room (half the budget at most), since the question
    is what "it" and "that" in the new one refer to. Other messages after the question
    get what room is left, newest first."""
    if max_history_chars <= 0:
        return []
    question = _last_question(history)
    if question is None:
        kept, _ = _newest_first(history, max_history_chars, keep_newest=True)
        return kept[::-1]
    asked = history[question]
    reserve = min(len(asked.content), max_history_chars // 2)
    recent, room = _newest_first(
        history[question + 1 :], max_history_chars - reserve, keep_newest=True
    )
    asked = shortened(asked, room + reserve)
    older, _ = _newest_first(
        history[:question], room + reserve - len(asked.content), keep_newest=False
    )
    return [*older[::-1], asked, *recent[::-1]]


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
