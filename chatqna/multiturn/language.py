"""A small, deterministic guess at whether a chat message is English.

History is embedded with an English model, so messages in another language are translated
first. The guess needs no model and no download: text written mostly in a non-Latin script
is not English; Latin-script text is scored by how many of its words are common function
words of English versus of Spanish, French, German, Italian, Portuguese and Dutch. Short or
ambiguous text counts as English, so it is never sent to translation on a whim.
"""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)

# Common function words per language: frequent, topic-free, and rarely shared.
_FUNCTION_WORD_TEXT = {
    "en": (
        "the a an and or of to in is are was were be been it this that these those what how "
        "why when where which who can could do does did i you he she we they my your with for "
        "on at by from not have has had will would should there their about after before"
    ),
    "es": (
        "el la los las un una y o de del que en es son fue ser está están por para con no se "
        "su sus lo al como qué cómo cuándo dónde puedo puede mi tu hay más pero este esta"
    ),
    "fr": (
        "le la les un une et ou de des du que qui en est sont était être pour par avec ne pas "
        "se sa son ses au aux comment quand où je tu il elle nous vous mon ma mes ce cette"
    ),
    "de": (
        "der die das ein eine und oder von zu im ist sind war sein für mit nicht sich auf wie "
        "was wann wo ich du er sie wir ihr mein dein kann können den dem des auch noch"
    ),
    "it": (
        "il lo la i gli le un una e o di del della che in è sono era essere per con non si "
        "suo sua come cosa quando dove io tu lui lei noi voi mio posso può anche questo"
    ),
    "pt": (
        "o a os as um uma e ou de do da dos das que em é são foi ser está por para com não se "
        "seu sua como quando onde eu você ele ela nós meu minha posso pode mais isso"
    ),
    "nl": (
        "de het een en of van te in is zijn was voor met niet zich op hoe wat wanneer waar ik "
        "jij je hij zij wij mijn kan kunnen ook nog dit dat deze er naar bij"
    ),
}


def _vocabulary(text: str) -> frozenset[str]:
    return frozenset(text.split(" "))


FUNCTION_WORDS = {lang: _vocabulary(text) for lang, text in _FUNCTION_WORD_TEXT.items()}

MIN_WORDS = 3


def _latin_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 1.0
    latin = sum(1 for c in letters if "LATIN" in unicodedata.name(c, ""))
    return latin / len(letters)


def detect_language(text: str) -> str:
    """`en`, another language code, `non-latin`, or `unknown` (too little to tell)."""
    if _latin_share(text) < 0.5:
        return "non-latin"
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < MIN_WORDS:
        return "unknown"
    hits = {lang: sum(1 for w in words if w in vocab) for lang, vocab in FUNCTION_WORDS.items()}
    best = max(hits, key=lambda lang: (hits[lang], lang == "en"))
    if hits[best] == 0 or hits[best] <= hits["en"]:
        return "en" if hits["en"] > 0 else "unknown"
    # Demand a clear margin over English: loanwords and names should not trigger translation.
    if hits[best] >= max(2, 2 * hits["en"]):
        return best
    return "en" if hits["en"] > 0 else "unknown"


def needs_translation(text: str) -> bool:
    """True when the message is confidently not English."""
    return detect_language(text) not in ("en", "unknown")
