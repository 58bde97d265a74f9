"""Condense mode: an LLM rewrites a follow-up into a standalone question, and fails closed.

With an empty history window, or a history with no user message (a UI's greeting), no LLM
call is made: the raw message is the retrieval query (status `skipped_no_history`).
Otherwise one chat call asks for JSON `{"standalone_query": "..."}` (as a JSON-schema
response format) from a prompt that says:
reformulate the latest message so it stands alone, return it unchanged if it already does,
never answer it. The rewrite then drives the dense leg, the BM25 leg and the reranker; the
answer prompt keeps the user's raw words.

Any failure fails the turn with `CondenseFailed` (HTTP 503); there is no fallback:

| reason          | when                                                                 |
|-----------------|----------------------------------------------------------------------|
| `timeout`       | no reply within `CONDENSE_TIMEOUT_SECONDS`                           |
| `http_error`    | the LLM server answered with an HTTP error or could not be reached   |
| `bad_body`      | not a JSON object, control characters, or fails the output guard     |
| `missing_field` | the JSON object has no `standalone_query`                            |
| `empty_query`   | `standalone_query` is blank after clean-up                           |

Output guard (`clean_rewrite`): surrounding quotes and labels such as "Standalone question:"
are stripped and whitespace collapsed; the text is cut on a word boundary at `max_chars`,
or at twice the latest message's length when that is more. A reply is rejected as
`bad_body` when it is meta-text (talks about the task: "here is", "rewritten", "as an AI",
"I cannot"...) or answer-shaped: it opens with yes/no, or it holds two or more sentences
and does not end with a question mark, or it has more than 60 words (or twice the latest
message's words, when that is more), or the latest message is a question (ends with "?")
and the rewrite is not. The user's own words are exempt only where the rewrite copies
them: a meta phrase inside the whole latest message or a longer run of its words ("I can't
find the Export button, where is it?"), a yes/no opening when the message opens with the
same word ("No, I meant after I cancel?"). A rewrite that holds the whole latest message
is accepted if it adds only a qualifier: no sentence before it, nothing after its closing
question mark, no sentence or clause after it. Temperature 0 gives the same reply on every
retry, so refusing the user's own words would fail that question for good; an answer or a
refusal wrapped around them must still fail. The prompt shows each history message cut to
its first 400 characters (`shortened`); the reply may use 64 tokens, more for a long
latest message (`reply_tokens`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from chatqna.backends.protocols import ChatLLM, GenerationParams
from chatqna.errors import (
    BadUpstreamResponse,
    CondenseFailed,
    ContextTooLong,
    UpstreamError,
    UpstreamTimeout,
)
from chatqna.multiturn.history import (
    ROLES_BOTH,
    Conversation,
    Message,
    cut_on_word,
    shortened,
)

logger = logging.getLogger(__name__)

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_SKIPPED = "skipped_no_history"

SYSTEM_PROMPT = """\
You turn the latest message of a conversation into a standalone search question.
Rules:
- Rewrite the latest message so it can be understood without the conversation: replace \
words like "it", "that", "this" and "there" with what they refer to.
- If the latest message is already standalone, return it unchanged.
- Never answer the question. Never add facts that are not in the conversation.
- Reply with JSON only: {"standalone_query": "<the question>"}

Example 1
Conversation:
User: Which plans include single sign-on?
Assistant: Single sign-on is part of the Enterprise plan.
Latest message: How much does it cost?
Reply: {"standalone_query": "How much does the Enterprise plan cost?"}

Example 2
Conversation:
User: Can I change my username?
Assistant: Yes, once every 30 days in your profile settings.
Latest message: What are the accepted payment methods?
Reply: {"standalone_query": "What are the accepted payment methods?"}"""

RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "standalone_query",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"standalone_query": {"type": "string", "minLength": 1}},
            "required": ["standalone_query"],
            "additionalProperties": False,
        },
    },
}

_LABEL = re.compile(
    r"^\s*(standalone|rewritten|reformulated|search)?\s*(question|query)\s*:\s*", re.IGNORECASE
)
_META = re.compile(
    r"\b(here is|here's|standalone (question|query)|rewritten|reformulat\w*|as an ai|"
    r"i cannot|i can't|i'm sorry|i am sorry|language model|the latest message)\b",
    re.IGNORECASE,
)
_YES_NO = re.compile(r"^(yes|no|sure|certainly)\b\s*[,.!]", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?](?:\s+|$)")
_WORD = re.compile(r"[\w']+")
# After a message the rewrite holds: a new sentence, or a clause set off by punctuation.
_ADDED_SENTENCE = re.compile(r"[.!?]\s+\S")
_ADDED_CLAUSE = re.compile(r"\s*(?:[,;:.!?–—]+|-+\s)\s*\w")
# NUL and the like: never in a question, and some stores and servers refuse them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_QUOTES = "\"'`“”‘’«»"
MAX_WORDS = 60
MAX_TOKENS = 64
# The subject of a follow-up sits in the first words of a message; long answers are cut here
# to keep the rewrite prompt (and its latency) small.
HISTORY_MESSAGE_CHARS = 400
# A reply is a JSON object around one rewrite, which is cut at `rewrite_chars`: escaped (six
# characters for `\u00e9`) and fenced in ``` it is still within 8 times that and 256 more.
# A longer reply is no rewrite, and is rejected before it is parsed or cleaned.
REPLY_CHARS_PER_CHAR = 8
REPLY_EXTRA_CHARS = 256


def clean_rewrite(text: str, max_chars: int) -> str:
    """Strip quotes and labels, collapse whitespace, cut at `max_chars` on a word boundary."""
    cleaned = " ".join(text.split())
    for _ in range(3):  # labels and quotes may nest: 'Query: "How ...?"'
        cleaned = _LABEL.sub("", cleaned).strip().strip(_QUOTES).strip()
    return cut_on_word(cleaned, max_chars)


def rewrite_chars(latest: str, max_chars: int) -> int:
    """Where a rewrite is cut: `max_chars`, or twice the latest message when that is longer
    (a rewrite restates the message and adds its subject)."""
    return max(max_chars, 2 * len(latest.strip()))


def rewrite_words(latest: str) -> int:
    """The most words a rewrite may have: `MAX_WORDS`, or twice the latest message's."""
    return max(MAX_WORDS, 2 * len(latest.split()))


def reply_tokens(latest: str) -> int:
    """The rewrite call's `max_tokens`: `MAX_TOKENS`, or enough for a long latest message
    restated in the JSON reply (a token per two characters, and room for the subject)."""
    return max(MAX_TOKENS, len(latest.strip()) // 2 + 32)


def _plain(text: str) -> str:
    """Lower case, straight apostrophes, collapsed whitespace: for comparing wordings."""
    return " ".join(text.replace("’", "'").lower().split())


def _message_span(rewrite: str, message: str) -> tuple[int, int] | None:
    """Where the rewrite holds the whole latest message, as whole words (both plain)."""
    if not message:
        return None
    found = re.search(rf"(?<!\w){re.escape(message)}(?!\w)", rewrite)
    return None if found is None else found.span()


def _copied_runs(rewrite: str, message: str) -> list[tuple[int, int, int]]:
    """Runs of the message's words that the rewrite repeats in the message's order, as
    (start, end, words) character spans of the rewrite (difflib's matching blocks)."""
    ours = list(_WORD.finditer(rewrite))
    theirs = _WORD.findall(message)
    matcher = SequenceMatcher(None, [w.group() for w in ours], theirs, autojunk=False)
    return [
        (ours[a].start(), ours[a + size - 1].end(), size)
        for a, _, size in matcher.get_matching_blocks()
        if size
    ]


def _meta_text(rewrite: str, message: str, span: tuple[int, int] | None) -> bool:
    """Meta-text the rewrite did not copy from the message: a phrase counts as the user's
    only inside the copied message, or inside a run of the message's words longer than
    the phrase (copied alone, "I cannot" may be the model's own refusal)."""
    runs = _copied_runs(rewrite, message)
    for match in _META.finditer(rewrite):
        start, end = match.span()
        if span is not None and span[0] <= start and end <= span[1]:
            continue
        words = len(_WORD.findall(match.group(0)))
        if not any(a <= start and end <= b and size > words for a, b, size in runs):
            return True
    return False


def _opens_with_yes_no(text: str, message: str) -> bool:
    """Whether the rewrite opens with yes/no where the message does not open with it."""
    opening = _YES_NO.match(text)
    if opening is None:
        return False
    first = _WORD.search(message)
    return first is None or first.group() != opening.group(1).lower()


def _added_to_message(rewrite: str, span: tuple[int, int], message: str) -> str | None:
    """For a rewrite that holds the whole message: why what it adds is more than a
    qualifier of the message (a sentence before it, any text after its question mark,
    a sentence or clause after it)."""
    before, after = rewrite[: span[0]], rewrite[span[1] :]
    if _SENTENCE_END.search(before):
        return "answer-shaped (adds a sentence before the message)"
    if message.endswith("?") and after.strip():
        return "answer-shaped (adds text after the question)"
    if _ADDED_CLAUSE.match(after) or _ADDED_SENTENCE.search(after):
        return "answer-shaped (adds a sentence or clause after the message)"
    return None


def guard_violation(text: str, latest: str = "") -> str | None:
    """Why a cleaned rewrite is unusable (meta-text or answer-shaped), or None if it is fine."""
    limit = rewrite_words(latest)
    if len(text.split()) > limit:
        return f"answer-shaped (more than {limit} words)"
    rewrite, message = _plain(text), _plain(latest)
    span = _message_span(rewrite, message)
    if _meta_text(rewrite, message, span):
        return "meta-text"
    if _opens_with_yes_no(text, message):
        return "answer-shaped (opens with yes/no)"
    if span is not None:
        added = _added_to_message(rewrite, span, message)
        if added is not None:
            return added
        rewrite = f"{rewrite[: span[0]]} message {rewrite[span[1] :]}"  # the user's sentences
    sentences = [s for s in _SENTENCE_END.split(rewrite) if s.strip()]
    if len(sentences) >= 2 and not text.endswith("?"):
        return "answer-shaped (several sentences, no question)"
    if message.endswith("?") and not text.endswith("?"):
        return "answer-shaped (a question rewritten as a statement)"
    return None


def _one_line(message: Message, limit: int) -> str:
    return shortened(Message(message.role, " ".join(message.content.split())), limit).content


def transcript(history: Sequence[Message], latest: str, message_chars: int | None = None) -> str:
    """The conversation as the rewrite prompt shows it; long messages are shortened."""
    limit = HISTORY_MESSAGE_CHARS if message_chars is None else message_chars
    lines = ["Conversation:"]
    lines += [
        f"{'User' if m.role == 'user' else 'Assistant'}: {_one_line(m, limit)}" for m in history
    ]
    lines.append(f"Latest message: {latest.strip()}")
    return "\n".join(lines)


def parse_reply(content: str, max_chars: int, latest: str = "") -> str:
    """The standalone query in an LLM reply, or `CondenseFailed` with the documented reason."""
    longest = REPLY_CHARS_PER_CHAR * rewrite_chars(latest, max_chars) + REPLY_EXTRA_CHARS
    if len(content) > longest:
        raise CondenseFailed("bad_body", f"the reply is longer than {longest} characters")
    body = content.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError as exc:
        raise CondenseFailed("bad_body", "the reply is not JSON") from exc
    if not isinstance(parsed, dict):
        raise CondenseFailed("bad_body", "the reply is not a JSON object")
    if "standalone_query" not in parsed:
        raise CondenseFailed("missing_field", "no standalone_query in the reply")
    value = parsed["standalone_query"]
    if value is None:
        raise CondenseFailed("empty_query", "standalone_query is null")
    if not isinstance(value, str):
        raise CondenseFailed("bad_body", "standalone_query is not a string")
    query = clean_rewrite(value, rewrite_chars(latest, max_chars))
    if not query:
        raise CondenseFailed("empty_query", "standalone_query is blank")
    if _CONTROL.search(query):
        raise CondenseFailed("bad_body", "standalone_query holds control characters")
    violation = guard_violation(query, latest)
    if violation is not None:
        raise CondenseFailed("bad_body", f"rejected by the output guard: {violation}")
    return query


@dataclass(frozen=True)
class CondenseOutcome:
    """What condense did for one turn: the retrieval query and how it was obtained."""

    status: str
    query: str
    raw_query: str
    history_size: int
    latency_ms: float = 0.0
    model: str | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rewritten(self) -> bool:
        return self.status == STATUS_OK


async def condense_follow_up(
    conversation: Conversation,
    llm: ChatLLM,
    *,
    history_turns: int,
    timeout_seconds: float,
    max_chars: int,
) -> CondenseOutcome:
    """Rewrite the turn's query into a standalone question, or raise `CondenseFailed`.
    Every setting is a required argument: `MultiTurnConfig` (from `Settings`) holds them."""
    # Both sides of the chat: the rewrite needs the answer a follow-up refers to.
    window = conversation.window(history_turns, ROLES_BOTH)
    if not window:  # no history, or a greeting alone
        return CondenseOutcome(STATUS_SKIPPED, conversation.query, conversation.query, 0)
    prompt = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": transcript(window, conversation.query)},
    ]
    params = GenerationParams(
        max_tokens=reply_tokens(conversation.query),
        temperature=0.0,
        response_format=RESPONSE_FORMAT,
    )
    started = time.perf_counter()
    try:
        completion = await asyncio.wait_for(llm.complete(prompt, params), timeout_seconds)
        query = parse_reply(completion.text, max_chars, conversation.query)
    except CondenseFailed as exc:
        raise _record(exc, started, len(window), llm.model) from exc.__cause__
    except (TimeoutError, UpstreamTimeout) as exc:
        failure = CondenseFailed("timeout", f"no reply within {timeout_seconds}s")
        raise _record(failure, started, len(window), llm.model) from exc
    except BadUpstreamResponse as exc:
        failure = CondenseFailed("bad_body", exc.message)
        raise _record(failure, started, len(window), llm.model) from exc
    except (UpstreamError, ContextTooLong) as exc:  # the LLM refused the request
        failure = CondenseFailed("http_error", exc.message)
        raise _record(failure, started, len(window), llm.model) from exc
    latency = round((time.perf_counter() - started) * 1000, 3)
    return CondenseOutcome(STATUS_OK, query, conversation.query, len(window), latency, llm.model)


def _record(
    failure: CondenseFailed, started: float, history_size: int, model: str
) -> CondenseFailed:
    failure.latency_ms = round((time.perf_counter() - started) * 1000, 3)
    failure.history_size = history_size
    failure.model = model
    logger.warning("condense failed (reason=%s): %s", failure.reason, failure.detail)
    return failure
