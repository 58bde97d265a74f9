"""The embedding-stage cost of blend mode: a follow-up turn with the blend vs the baseline.

    .venv/bin/python benchmarks/blend_latency.py [--repeat 200] [--tei URL]

Plans the same follow-up turn with the service's own multi-turn strategy (`build_strategy`
from `MultiTurnConfig.from_settings`, the path `Pipeline.prepare` runs), under the shipped
multi-turn configuration (`.env.example`: blend on, alpha 0.7, two messages newest first,
self-contained check at 0.4, history translation on) and two variations of it, alternating:
baseline (blend off: one single-string call), blend (the check off: one batched call of
query + history) and shipped (the previous question a third input of the same call),
`--repeat` times each in the same process, on the embedded MiniLM (or a TEI server with
`--tei`). The history is English, so the translator only identifies its language. Prints
medians, p95 and the ratio, and writes `results/blend_latency.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.protocols import Embedder
from chatqna.composition import build_embedder, build_translator
from chatqna.multiturn.history import Message, split_conversation
from chatqna.multiturn.strategy import MultiTurnConfig, MultiTurnStrategy, build_strategy
from chatqna.settings import Settings

MODES = ("baseline", "blend", "shipped")
# The multi-turn settings of `.env.example` (the shipped configuration).
SHIPPED = {
    "multi_turn_mode": "blend",
    "multi_turn_blend_enabled": True,
    "multi_turn_blend_alpha": 0.7,
    "multi_turn_history_turns": 2,
    "multi_turn_history_order": "newest_first",
    "multi_turn_history_roles": "user_assistant",
    "multi_turn_assistant_weight": 0.5,
    "multi_turn_bm25_history_weight": 0.3,
    "multi_turn_self_contained_similarity": 0.4,
    "multi_turn_rerank_query": "conversation",
    "multi_turn_translate_history": True,
}
# What each row changes in the shipped configuration.
VARIATIONS: dict[str, dict[str, Any]] = {
    "baseline": {"multi_turn_blend_enabled": False},
    "blend": {"multi_turn_self_contained_similarity": 0.0},
    "shipped": {},
}
# The follow-up as the API hands it over: split by `split_conversation`.
TURN = split_conversation(
    [
        Message("user", "How do I reset my password?"),
        Message(
            "assistant",
            "Use the Forgot password link on the sign-in page; the reset "
            "link is valid for 1 hour and can be used once.",
        ),
        Message("user", "What if I never get the email?"),
        Message(
            "assistant",
            "Check the spam folder, then ask a workspace owner to resend "
            "the invitation or contact support from the sign-in page.",
        ),
        Message("user", "Can you elaborate on this?"),
    ]
)


def row_settings(tei: str | None, mode: str) -> Settings:
    """The shipped settings with one row's variation."""
    return Settings(tei_embedding_endpoint=tei, **{**SHIPPED, **VARIATIONS[mode]})


def row_strategy(settings: Settings, embedder: Embedder, llm: ScriptedLLM) -> MultiTurnStrategy:
    """The service's strategy under `settings`, built as `Pipeline.build` builds it."""
    translator = build_translator(settings, llm)
    config = MultiTurnConfig.from_settings(settings)
    return build_strategy(config, embedder=embedder, translator=translator)


async def measure(tei: str | None, repeat: int) -> dict[str, Any]:
    embedder = await build_embedder(row_settings(tei, "shipped"))
    # The translator's LLM: never asked, as the turn's history is English (checked below).
    llm = ScriptedLLM()
    strategies = {mode: row_strategy(row_settings(tei, mode), embedder, llm) for mode in MODES}
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for round_ in range(repeat + 5):
            for mode in MODES:
                started = time.perf_counter()
                await strategies[mode].plan(TURN)
                if round_ >= 5:  # the first rounds warm the runtime up
                    samples[mode].append((time.perf_counter() - started) * 1000)
    finally:
        await embedder.aclose()
    if llm.prompts:
        raise RuntimeError("the history was translated: the turn no longer measures embedding")
    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    p95 = {mode: sorted(values)[int(0.95 * (len(values) - 1))] for mode, values in samples.items()}
    return {
        "embedder": embedder.name,
        "repeat": repeat,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "median_ms": {k: round(v, 3) for k, v in medians.items()},
        "p95_ms": {k: round(v, 3) for k, v in p95.items()},
        "ratio_median": round(medians["blend"] / medians["baseline"], 3),
        "ratio_median_shipped": round(medians["shipped"] / medians["baseline"], 3),
        "configuration": SHIPPED,
        "variations": VARIATIONS,
        "embedding_inputs": {"baseline": 1, "blend": 2, "shipped": 3},
        "embedding_calls": {"baseline": 1, "blend": 1, "shipped": 1},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--tei", help="TEI base URL to measure instead of the embedded model")
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "blend_latency.json"
    )
    args = parser.parse_args()
    start_run()
    result = asyncio.run(measure(args.tei, args.repeat))
    print(
        f"embedding stage of one follow-up turn, {result['embedder']}, "
        f"{result['repeat']} runs each:"
    )
    print("| path     | inputs | calls | median ms | p95 ms |")
    print("|----------|--------|-------|-----------|--------|")
    for mode in MODES:
        print(
            f"| {mode:<8} | {result['embedding_inputs'][mode]:>6} | "
            f"{result['embedding_calls'][mode]:>5} | {result['median_ms'][mode]:>9.2f} | "
            f"{result['p95_ms'][mode]:>6.2f} |"
        )
    print(f"blend / baseline (medians): {result['ratio_median']:.2f}x")
    print(f"shipped / baseline (medians): {result['ratio_median_shipped']:.2f}x")
    write_result(args.output, result)
    print(f"written to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
