"""How well history normalisation tells English from other languages on short follow-ups.

    .venv/bin/python benchmarks/language_id.py [--repeat 20]

Reads `datasets/language-id/follow_ups.json` (ten 3-10 word follow-ups in each of 18
languages, and 15 short English fragments such as "ok" or "OAuth scopes?") and runs the
service's own `chatqna.multiturn.language` on each. Per language: how often the exact
language comes out, how often the translate/keep decision is right (English kept, every
other language sent to translation), how often the model was unsure (`unknown`, left
untranslated). Also the confidence threshold's effect on the decision, and the cost of one
call (median over `--repeat` passes, the model already loaded). Writes
`results/language_id.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

from chatqna.multiturn import language

HERE = Path(__file__).resolve().parent
DATASET = HERE / "datasets" / "language-id" / "follow_ups.json"
RESULT = HERE / "results" / "language_id.json"
THRESHOLDS = (0.0, 0.3, 0.5, 0.7, 0.9)


def per_language(sentences: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for code, texts in sentences.items():
        found = [language.detect_language(text) for text in texts]
        right_decision = [(code != "en") == (got not in ("en", "unknown")) for got in found]
        table[code] = {
            "sentences": len(texts),
            "exact": sum(got == code for got in found),
            "decision_right": sum(right_decision),
            "unknown": found.count("unknown"),
            "misses": {t: g for t, g in zip(texts, found, strict=True) if g != code},
        }
    return table


def threshold_sweep(sentences: dict[str, list[str]], fragments: list[str]) -> list[dict[str, Any]]:
    raw = {code: [language.identify(text) for text in texts] for code, texts in sentences.items()}
    raw_fragments = [language.identify(text) for text in fragments]
    rows = []
    for threshold in THRESHOLDS:
        english_sent = other_kept = 0
        for code, guesses in raw.items():
            for guess, probability in guesses:
                translated = probability >= threshold and guess != "en"
                if code == "en":
                    english_sent += translated
                else:
                    other_kept += not translated
        rows.append(
            {
                "min_confidence": threshold,
                "english_sent_to_translation": english_sent,
                "english_fragments_sent_to_translation": sum(
                    probability >= threshold and guess != "en"
                    for guess, probability in raw_fragments
                ),
                "other_left_untranslated": other_kept,
            }
        )
    return rows


def cost_per_call(texts: list[str], repeat: int) -> dict[str, float]:
    started = time.perf_counter()
    language.warm_up()
    load_s = time.perf_counter() - started
    passes = []
    for _ in range(repeat):
        started = time.perf_counter()
        for text in texts:
            language.detect_language(text)
        passes.append((time.perf_counter() - started) / len(texts))
    return {"model_load_s": round(load_s, 3), "median_us_per_call": statistics.median(passes) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    start_run()
    dataset = json.loads(DATASET.read_text())
    sentences: dict[str, list[str]] = dataset["sentences"]
    fragments: list[str] = dataset["english_fragments"]
    texts = [text for group in sentences.values() for text in group]
    cost = cost_per_call(texts, args.repeat)
    table = per_language(sentences)
    total = len(texts)
    summary = {
        "sentences": total,
        "languages": len(sentences),
        "exact": sum(row["exact"] for row in table.values()),
        "decision_right": sum(row["decision_right"] for row in table.values()),
        "unknown": sum(row["unknown"] for row in table.values()),
        "english_fragments": len(fragments),
        "english_fragments_sent_to_translation": sum(map(language.needs_translation, fragments)),
    }
    result = {
        "library": "py3langid 0.4.0",
        "min_confidence": language.MIN_CONFIDENCE,
        "summary": summary,
        "cost": {k: round(v, 1) if k.endswith("call") else v for k, v in cost.items()},
        "per_language": table,
        "threshold_sweep": threshold_sweep(sentences, fragments),
    }
    write_result(RESULT, result)
    print(f"{'lang':5} {'exact':>6} {'decision':>9} {'unknown':>8}")
    for code, row in table.items():
        n = row["sentences"]
        print(f"{code:5} {row['exact']:>3}/{n} {row['decision_right']:>6}/{n} {row['unknown']:>8}")
    print(f"all   {summary['exact']}/{total} {summary['decision_right']}/{total}")
    print(
        f"english fragments sent to translation: "
        f"{summary['english_fragments_sent_to_translation']}/{len(fragments)}"
    )
    print(f"cost: {result['cost']}")
    for row in result["threshold_sweep"]:
        print(row)
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
