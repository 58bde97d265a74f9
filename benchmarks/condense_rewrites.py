"""The condense prompt and output guard on the handbook lab: every rewrite, judged.

    .venv/bin/python benchmarks/condense_rewrites.py [--dataset DIR]

For each follow-up of the dataset (the handbook lab by default) the configured LLM (the
embedded SmolLM2 unless LLM_ENDPOINT / CONDENSE_LLM_ENDPOINT say otherwise) rewrites the
message through the service's own condense strategy (`build_strategy` with
`MultiTurnConfig.from_settings`, `MULTI_TURN_MODE=condense`): the history window, timeout
(`CONDENSE_TIMEOUT_SECONDS`) and length cap (`CONDENSE_MAX_QUERY_CHARS`) are the settings'
(`.env.example`'s unless the environment says otherwise). The script prints the
conversation, the rewrite (or the failure reason) and the verdict of the automatic rule in
`experiments/standalone.py` beside it, then the share judged standalone, and writes
`results/condense_rewrites.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from experiments.standalone import judge_standalone
from provenance import start_run, write_result

from chatqna.backends.fakes import HashingEmbedder
from chatqna.composition import build_condense_llm, build_llm
from chatqna.errors import CondenseFailed
from chatqna.evaluation.dataset import load_dataset
from chatqna.multiturn.strategy import MultiTurnConfig, build_strategy
from chatqna.settings import Settings

HERE = Path(__file__).parent


async def run(dataset_dir: Path) -> dict[str, Any]:
    settings = Settings(multi_turn_mode="condense")
    dataset = load_dataset(dataset_dir)
    llm = build_condense_llm(settings, await build_llm(settings))
    # Only the rewrite is judged: the embedder the plan then calls is a stand-in.
    condense = build_strategy(
        MultiTurnConfig.from_settings(settings), embedder=HashingEmbedder(), condense_llm=llm
    )
    rows = []
    try:
        for turn in (t for t in dataset.turns if t.is_follow_up):
            try:
                planned = await condense.plan(turn.conversation())
                rewrite, failure = planned.text, None
            except CondenseFailed as exc:
                rewrite, failure = None, f"{exc.reason}: {exc.detail}"
            verdict, why = judge_standalone(rewrite, turn.query, turn.gold_rewrite or turn.query)
            rows.append(
                {
                    "task": turn.key,
                    "history": [m.content for m in turn.history],
                    "message": turn.query,
                    "rewrite": rewrite,
                    "failure": failure,
                    "reference": turn.gold_rewrite,
                    "standalone": verdict,
                    "why": why,
                }
            )
    finally:
        await llm.aclose()
    judged = sum(1 for row in rows if row["standalone"])
    return {
        "dataset": dataset.name,
        "llm": llm.model,
        "follow_ups": len(rows),
        "standalone": judged,
        "share_standalone": round(judged / len(rows), 3),
        "failed": sum(1 for row in rows if row["failure"]),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dataset",
        type=Path,
        default=HERE / "datasets" / "handbook-lab",
        help="a dataset in the MTRAG layout: a directory holding corpus.jsonl and "
        "conversations.jsonl (see 'Getting the datasets' in site/docs/benchmarks.md); "
        "by default the handbook lab, benchmarks/datasets/handbook-lab",
    )
    parser.add_argument("--output", type=Path, default=HERE / "results" / "condense_rewrites.json")
    args = parser.parse_args()
    start_run()
    result = asyncio.run(run(args.dataset))
    for row in result["rows"]:
        print(f"[{row['task']}]")
        for line in row["history"][-2:]:
            print(f"   ... {line[:100]}")
        print(f"  message:   {row['message']}")
        shown = row["rewrite"] or f"(failed: {row['failure']})"
        print(f"  rewrite:   {shown}")
        print(f"  reference: {row['reference']}")
        print(f"  verdict:   {row['why']}")
    print(
        f"\n{result['llm']}: {result['standalone']}/{result['follow_ups']} rewrites judged "
        f"standalone ({result['share_standalone']:.0%}), {result['failed']} failed the guard "
        "or the call"
    )
    write_result(args.output, result)
    print(f"written to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
