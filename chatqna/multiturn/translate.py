"""Normalising history to English before it is embedded (blend mode).

Each message detected as confidently non-English (`chatqna.multiturn.language`, a
language-identification model) is translated by the chat LLM at most once: translations
are cached by the SHA-256 of the message text in a bounded LRU cache. A failed translation
(timeout, upstream error, empty reply) is logged, the original text is used, and the
outcome says so; it never fails the turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from chatqna.backends.protocols import ChatLLM, GenerationParams
from chatqna.errors import ChatQnAError
from chatqna.multiturn.history import Message
from chatqna.multiturn.language import needs_translation, warm_up

logger = logging.getLogger(__name__)

TRANSLATION_PROMPT = (
    "Translate the user's message into English. Reply with the English translation only, "
    "without quotes, notes or explanations."
)


@dataclass(frozen=True)
class TranslationReport:
    """What translating a blend's history did (the blend's record of it)."""

    enabled: bool
    ran: bool
    translated: int
    from_cache: int
    failed: int


@dataclass(frozen=True)
class TranslationOutcome:
    """The messages to embed, and what translation did to them."""

    messages: tuple[Message, ...]
    translated: int = 0
    cached: int = 0
    failed: int = 0

    def report(self, enabled: bool) -> TranslationReport:
        ran = self.translated + self.cached + self.failed > 0
        return TranslationReport(enabled, ran, self.translated, self.cached, self.failed)


class HistoryTranslator:
    """Translates non-English history messages with an LLM, caching each translation
    (`cache_size` 0: none is remembered)."""

    def __init__(
        self,
        llm: ChatLLM,
        *,
        cache_size: int = 1024,
        timeout_seconds: float = 10.0,
        max_tokens: int = 256,
    ) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must be at least 0")
        self._llm = llm
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._cache_size = cache_size
        self._timeout = timeout_seconds
        self._max_tokens = max_tokens
        self.llm_calls = 0
        warm_up()  # load the language model at start-up, not on the first chat turn

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _remember(self, key: str, translation: str) -> None:
        self._cache[key] = translation
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _translate(self, text: str) -> str:
        self.llm_calls += 1
        prompt = [
            {"role": "system", "content": TRANSLATION_PROMPT},
            {"role": "user", "content": text},
        ]
        params = GenerationParams(max_tokens=self._max_tokens, temperature=0.0)
        completion = await asyncio.wait_for(self._llm.complete(prompt, params), self._timeout)
        translation = completion.text.strip()
        if not translation:
            raise ValueError("empty translation")
        return translation

    async def normalise(self, messages: Sequence[Message]) -> TranslationOutcome:
        """Return the messages with non-English contents replaced by English ones."""
        out: list[Message] = []
        translated = cached = failed = 0
        for message in messages:
            if not needs_translation(message.content):
                out.append(message)
                continue
            key = self.key(message.content)
            if key in self._cache:
                self._cache.move_to_end(key)
                out.append(Message(message.role, self._cache[key]))
                cached += 1
                continue
            try:
                english = await self._translate(message.content)
            except (ChatQnAError, TimeoutError, ValueError) as exc:
                logger.warning(
                    "history translation failed, using the original text: %s",
                    getattr(exc, "message", None) or type(exc).__name__,
                )
                out.append(message)
                failed += 1
                continue
            if self._cache_size:
                self._remember(key, english)
            out.append(Message(message.role, english))
            translated += 1
        return TranslationOutcome(tuple(out), translated, cached, failed)
