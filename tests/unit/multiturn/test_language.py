"""Language identification: which history messages are worth translating."""

from __future__ import annotations

import pytest

from chatqna.multiturn import language
from chatqna.multiturn.language import detect_language, identify, needs_translation

SPANISH = "¿Cómo puedo exportar mis datos después de cancelar la suscripción?"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("How do I export my data?", "en"),
        ("Can you elaborate on this?", "en"),
        (SPANISH, "es"),
        ("¿Cuánto tiempo tengo?", "es"),
        ("Comment exporter mes données après la résiliation ?", "fr"),
        ("Wie kann ich meine Daten exportieren, wenn ich kündige?", "de"),
        ("Hoe kan ik mijn gegevens exporteren?", "nl"),
        ("Czy to możliwe po anulowaniu?", "pl"),
        ("Kan jag få pengarna tillbaka?", "sv"),
        ("Paramı geri alabilir miyim?", "tr"),
        ("Bagaimana dengan paket tahunan?", "id"),
        ("Tôi có được hoàn tiền không?", "vi"),
        ("Můžu dostat peníze zpět?", "cs"),
        ("Pot să primesc banii înapoi?", "ro"),
        ("データをエクスポートするにはどうすればよいですか", "ja"),
        ("Сколько у меня времени?", "ru"),
        ("La la land is a film about the music of the city", "en"),
    ],
)
def test_detect_language(text: str, code: str) -> None:
    assert detect_language(text) == code


@pytest.mark.parametrize("text", ["Ok", "thanks!", "SSO?", "v2 webhooks", "1234 ?!", ""])
def test_fragments_the_model_is_unsure_of_are_unknown(text: str) -> None:
    assert detect_language(text) == "unknown"


def test_unknown_means_the_best_guess_is_below_the_threshold() -> None:
    guess, probability = identify("v2 webhooks")
    assert guess != "en" and 0 < probability < language.MIN_CONFIDENCE


def test_short_or_english_text_is_never_sent_to_translation() -> None:
    assert not needs_translation("Yes please")
    assert not needs_translation("Open Settings > Workspace > Export.")
    assert not needs_translation("OAuth scopes?")
    assert needs_translation(SPANISH)
    assert needs_translation("Ile mam czasu?")
