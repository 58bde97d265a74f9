"""Is a chat message English? A language-identification model that ships in its wheel.

History is embedded with an English model, so messages in another language are translated
first. py3langid (a maintained fork of langid.py: a naive Bayes classifier over byte
n-grams, 97 languages) decides. Its weights are inside the wheel (`model.npz.xz`, 4.6 MB),
it needs nothing but numpy, and it never downloads anything. Its normalised probability is
the confidence: below `MIN_CONFIDENCE` a message counts as `unknown` and is left as it is,
so a product name or an "ok" is never sent to translation on a whim.
`benchmarks/language_id.py` measures it on short follow-ups in 18 languages.
"""

from __future__ import annotations

import functools

from py3langid.langid import MODEL_FILE, LanguageIdentifier

__all__ = ["MIN_CONFIDENCE", "detect_language", "identify", "needs_translation", "warm_up"]

# The share of probability the best language must hold. Chosen on the benchmark: short
# English fragments ("ok", "OAuth scopes?") never reach 0.3 for another language, while all
# but 2 of 170 non-English follow-ups do (see the Generation page).
MIN_CONFIDENCE = 0.3


@functools.cache
def _identifier() -> LanguageIdentifier:
    # Decompressing the model takes about a second: once per process.
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def warm_up() -> None:
    """Load the model now (at start-up) rather than on the first message."""
    _identifier()


def identify(text: str) -> tuple[str, float]:
    """The most likely language (ISO 639-1 code) and its probability."""
    language, probability = _identifier().classify(text)
    return str(language), float(probability)


def detect_language(text: str) -> str:
    """A language code (`en`, `es`, `zh`, ...), or `unknown` when the model is not sure."""
    if not any(character.isalpha() for character in text):
        return "unknown"
    language, probability = identify(text)
    return language if probability >= MIN_CONFIDENCE else "unknown"


def needs_translation(text: str) -> bool:
    """True when the message is confidently not English."""
    return detect_language(text) not in ("en", "unknown")
