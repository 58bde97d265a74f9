"""History translation: once per message, cached, bounded, failures keep the original."""

from __future__ import annotations

import pytest

from chatqna.backends.fakes import ScriptedLLM
from chatqna.errors import UpstreamTimeout
from chatqna.multiturn import translate
from chatqna.multiturn.history import Message
from chatqna.multiturn.translate import HistoryTranslator, TranslationReport

pytestmark = pytest.mark.anyio

SPANISH = "¿Cómo puedo exportar mis datos después de cancelar la suscripción?"


async def test_non_english_message_is_translated_once_and_cached() -> None:
    llm = ScriptedLLM("How can I export my data after cancelling the subscription?")
    translator = HistoryTranslator(llm, cache_size=8)
    history = [Message("user", SPANISH), Message("assistant", "Open Settings > Export.")]
    first = await translator.normalise(history)
    second = await translator.normalise(history)
    assert translator.llm_calls == 1 and len(llm.prompts) == 1
    assert llm.prompts[0][-1] == {"role": "user", "content": SPANISH}
    assert llm.params[0].temperature == 0.0
    english = "How can I export my data after cancelling the subscription?"
    assert first.messages[0] == Message("user", english)
    assert first.messages[1] == history[1]
    assert (first.translated, first.cached, first.failed) == (1, 0, 0)
    assert (second.translated, second.cached, second.failed) == (0, 1, 0)
    assert second.messages == first.messages
    assert first.report(True) == TranslationReport(
        enabled=True, ran=True, translated=1, from_cache=0, failed=0
    )


async def test_what_is_translated_is_what_needs_translation_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One decision, the one `benchmarks/language_id.py` measures: swap it and the
    translator follows it, whatever the language."""
    monkeypatch.setattr(translate, "needs_translation", lambda text: text == "Hello there")
    translator = HistoryTranslator(ScriptedLLM("Translated."))
    outcome = await translator.normalise([Message("user", SPANISH), Message("user", "Hello there")])
    assert outcome.messages == (Message("user", SPANISH), Message("user", "Translated."))
    assert outcome.translated == 1 and translator.llm_calls == 1


async def test_cache_is_bounded() -> None:
    translator = HistoryTranslator(ScriptedLLM("English text here."), cache_size=1)
    one = Message("user", SPANISH)
    two = Message("user", "Comment exporter mes données après la résiliation ?")
    await translator.normalise([one])
    await translator.normalise([two])  # evicts the first
    await translator.normalise([one])
    assert translator.llm_calls == 3


async def test_a_cache_of_size_zero_remembers_nothing() -> None:
    translator = HistoryTranslator(ScriptedLLM("English text here."), cache_size=0)
    for _ in range(2):
        outcome = await translator.normalise([Message("user", SPANISH)])
        assert (outcome.translated, outcome.cached) == (1, 0)
    assert translator.llm_calls == 2


async def test_failure_keeps_the_original_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    llm = ScriptedLLM(error=UpstreamTimeout("llm: timed out", backend="llm"))
    translator = HistoryTranslator(llm)
    outcome = await translator.normalise([Message("user", SPANISH)])
    assert outcome.messages == (Message("user", SPANISH),)
    assert outcome.failed == 1 and outcome.translated == 0
    assert outcome.report(True).failed == 1
    assert any("translation failed" in r.getMessage() for r in caplog.records)
    # A failure is not cached: the next turn tries again.
    await translator.normalise([Message("user", SPANISH)])
    assert translator.llm_calls == 2


async def test_blank_translation_counts_as_failure() -> None:
    outcome = await HistoryTranslator(ScriptedLLM("   ")).normalise([Message("user", SPANISH)])
    assert outcome.failed == 1 and outcome.messages[0].content == SPANISH
