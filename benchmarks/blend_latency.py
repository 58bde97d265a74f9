"""The embedding-stage cost of blend mode: a follow-up turn with the blend vs the baseline.

    .venv/bin/python benchmarks/blend_latency.py [--repeat 200] [--tei URL]

Runs the embedding stage of the pipeline (`blend_query`, the code `Pipeline.prepare` calls)
for the same follow-up turn, alternating baseline (blend off: one single-string call),
blend (one batched call of query + history) and blend with the self-contained check as
shipped (the previous question a third input of the same call), `--repeat` times each in
the same process, on
the embedded MiniLM (or a TEI server with `--tei`). Prints medians, p95 and the ratio, and
writes `results/blend_latency.json`.
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

from chatqna.composition import build_embedder
from chatqna.multiturn.blend import blend_query
from chatqna.multiturn.history import Conversation, Message
from chatqna.settings import Settings

MODES = ("baseline", "blend", "checked")
CHECK = 0.4  # MULTI_TURN_SELF_CONTAINED_SIMILARITY as shipped
TURN = Conversation(
    "Can you elaborate on this?",
    (
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
    ),
)


async def measure(settings: Settings, repeat: int) -> dict[str, Any]:
    embedder = await build_embedder(settings)
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for round_ in range(repeat + 5):
            for mode in MODES:
                started = time.perf_counter()
                await blend_query(
                    TURN,
                    embedder,
                    enabled=mode != "baseline",
                    alpha=0.7,
                    history_turns=6,
                    translator=None,
                    self_contained=CHECK if mode == "checked" else 0.0,
                )
                if round_ >= 5:  # the first rounds warm the runtime up
                    samples[mode].append((time.perf_counter() - started) * 1000)
    finally:
        await embedder.aclose()
    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    p95 = {mode: sorted(values)[int(0.95 * (len(values) - 1))] for mode, values in samples.items()}
    return {
        "embedder": embedder.name,
        "repeat": repeat,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "median_ms": {k: round(v, 3) for k, v in medians.items()},
        "p95_ms": {k: round(v, 3) for k, v in p95.items()},
        "ratio_median": round(medians["blend"] / medians["baseline"], 3),
        "ratio_median_checked": round(medians["checked"] / medians["baseline"], 3),
        "embedding_inputs": {"baseline": 1, "blend": 2, "checked": 3},
        "embedding_calls": {"baseline": 1, "blend": 1, "checked": 1},
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
    settings = Settings(tei_embedding_endpoint=args.tei)
    result = asyncio.run(measure(settings, args.repeat))
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
    print(f"checked / baseline (medians): {result['ratio_median_checked']:.2f}x")
    write_result(args.output, result)
    print(f"written to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
