"""English detection: which history messages are worth translating."""

from __future__ import annotations

import pytest

from chatqna.multiturn.language import detect_language, needs_translation

pytestmark = pytest.mark.anyio


SPANISH = "¿Cómo puedo exportar mis datos después de cancelar la suscripción?"


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("How do I export my data?", "en"),
        ("Can you elaborate on this?", "en"),
        (SPANISH, "es"),
        ("Comment exporter mes données après la résiliation ?", "fr"),
        ("Wie kann ich meine Daten exportieren, wenn ich kündige?", "de"),
        ("Hoe kan ik mijn gegevens exporteren?", "nl"),
        ("データをエクスポートするにはどうすればよいですか", "non-latin"),
        ("Ok", "unknown"),
        ("La la land is a film about the music of the city", "en"),
    ],
)
def test_detect_language(text: str, language: str) -> None:
    assert detect_language(text) == language


def test_short_or_english_text_is_never_sent_to_translation() -> None:
    assert not needs_translation("Yes please")
    assert not needs_translation("Open Settings > Workspace > Export.")
    assert needs_translation(SPANISH)
