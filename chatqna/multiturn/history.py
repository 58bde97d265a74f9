"""Splitting a chat into the query (the last user message) and the history before it.

The history window (`Conversation.window`) is the last `MULTI_TURN_HISTORY_TURNS` messages
of the chosen roles before the query; system messages never count as history, and a history
without a user message (a UI's greeting) counts as none. Blend and condense both take their
window from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Where a message was shortened (its start kept) to fit a limit.
CUT_MARK = " [...]"
# `MULTI_TURN_HISTORY_ROLES` values: `user_assistant` and `separate` window both sides of
# the chat, `user` the user's messages only.
ROLES_USER = "user"
ROLES_BOTH = "user_assistant"


@dataclass(frozen=True)
class Message:
    """One chat message with plain-text content."""

    role: str
    content: str

    def as_openai(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Conversation:
    """A request's messages, split: `query` is what the user asks now."""

    query: str
    history: tuple[Message, ...]
    system: tuple[str, ...] = ()

    @property
    def follows_up(self) -> bool:
        """Whether the user asked something before the query. A history of assistant
        messages only (a UI's greeting) is no conversation yet: the query is a first turn."""
        return any(message.role == "user" for message in self.history)

    def window(self, turns: int, roles: str) -> tuple[Message, ...]:
        """The last `turns` history messages of the chosen `roles` (`user_assistant` or
        `separate`: both sides; `user`: the user's only). Empty when the query follows up
        nothing (`follows_up`): a greeting alone is no history to search with."""
        if turns <= 0 or not self.follows_up:
            return ()
        wanted = ("user",) if roles == ROLES_USER else ("user", "assistant")
        return tuple(m for m in self.history if m.role in wanted)[-turns:]


def cut_on_word(text: str, limit: int) -> str:
    """The start of `text` in at most `limit` characters, cut between words (inside the
    first word only when that alone is longer)."""
    if len(text) <= limit:
        return text
    start = text[:limit]
    if not text[limit].isspace() and " " in start:
        start = start.rsplit(" ", 1)[0]
    return start.rstrip()


def shortened(message: Message, limit: int) -> Message:
    """`message` cut to at most `limit` characters on a word boundary, the cut marked."""
    if len(message.content) <= limit:
        return message
    start = cut_on_word(message.content, max(limit - len(CUT_MARK), 0))
    return Message(message.role, start + CUT_MARK)


def split_conversation(messages: Sequence[Message]) -> Conversation:
    """Split validated messages (the last one is the user's) into query, history, system."""
    if not messages or messages[-1].role != "user":
        raise ValueError("the last message must come from the user")
    system = tuple(m.content for m in messages[:-1] if m.role == "system")
    history = tuple(m for m in messages[:-1] if m.role in ("user", "assistant"))
    return Conversation(query=messages[-1].content, history=history, system=system)
