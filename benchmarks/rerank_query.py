"""What the reranker should score against, and whether the embedded one earns its place.

    .venv/bin/python benchmarks/rerank_query.py \\
        --dataset path/to/mtrag-clapnq [--dataset DIR ...] [--cache-dir benchmarks/.cache]

Every scored turn is planned with the service's own multi-turn strategy (through the harness's
`plan_turn`) under the shipped defaults, stateless and blended, and retrieved from the
embedded index (hybrid, the shipped fusion weights, 50 passages per leg, depth 10). Then the
ten candidates are reordered in each of these ways and Recall@5 is taken:

    off                      the fused order (no reranker)
    similarity: message      cosine with the message's own vector (the seeds' reranker)
    similarity: conversation cosine with the plan's rerank vector (the blended vector on a
                             blended follow-up), what `MULTI_TURN_RERANK_QUERY=conversation` does
    text form F              cosine with the embedding of `rerank_text(query, earlier
                             questions, F)`: a stand-in scorer for the text a cross-encoder
                             would read (no cross-encoder can be installed here)
    fused + similarity, w    weighted RRF (k=60) of the fused order (weight 1) and the
                             conversation similarity order (weight w)

The text forms are scored with the bi-encoder because no cross-encoder weights can be had
offline: they rank the forms against each other, not what bge-reranker would do with them.
Prints one table per dataset; writes `results/rerank_query.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments.rerank_forms import TEXT_FORMS, rerank_text
from provenance import start_run, write_result

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from chatqna.backends.protocols import Embedder  # noqa: E402
from chatqna.composition import build_embedder  # noqa: E402
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache  # noqa: E402
from chatqna.evaluation.compare import STATELESS, default_strategy  # noqa: E402
from chatqna.evaluation.dataset import EvalTurn, load_dataset  # noqa: E402
from chatqna.evaluation.metrics import paired_bootstrap, turn_metrics  # noqa: E402
from chatqna.evaluation.modes import plan_turn  # noqa: E402
from chatqna.evaluation.runner import build_index  # noqa: E402
from chatqna.multiturn.blend import earlier_questions  # noqa: E402
from chatqna.multiturn.strategy import QueryPlan  # noqa: E402
from chatqna.pipeline.sources import search_query  # noqa: E402
from chatqna.retrieval.fusion import reciprocal_rank_fusion  # noqa: E402
from chatqna.settings import Settings  # noqa: E402

DEPTH = 10
FUSION_WEIGHTS = (0.25, 0.5, 1.0)
Reorder = Callable[[list[str], np.ndarray], list[str]]


def by_cosine(ids: list[str], passages: np.ndarray, vector: np.ndarray) -> list[str]:
    scores = passages @ np.asarray(vector, np.float32).reshape(-1)
    return [ids[i] for i in np.argsort(-scores, kind="stable")]


async def orders(
    turn: EvalTurn,
    plan: QueryPlan,
    hits_ids: list[str],
    passages: np.ndarray,
    embedder: Embedder,
    blended: bool,
) -> dict[str, list[str]]:
    """Every reordering of one turn's candidates, by variant name (the text forms only for
    the blend, whose follow-ups are where the service uses them)."""
    own = (await embedder.embed([turn.query]))[0]
    conversation = plan.rerank.vector if plan.rerank.vector is not None else own
    result = {
        "off": hits_ids,
        "similarity: message": by_cosine(hits_ids, passages, own),
        "similarity: conversation": by_cosine(hits_ids, passages, conversation),
    }
    asked = earlier_questions(turn.conversation())
    for form in TEXT_FORMS if blended else ():
        text = rerank_text(turn.query, asked, form)
        vector = (await embedder.embed([text]))[0]
        result[f"text form {form}"] = by_cosine(hits_ids, passages, vector)
    for weight in FUSION_WEIGHTS:
        fused = reciprocal_rank_fusion(
            [hits_ids, result["similarity: conversation"]], k=60, weights=(1.0, weight)
        )
        result[f"fused + similarity, w={weight:g}"] = [key for key, _ in fused]
    return result


async def run_dataset(path: Path, cache_dir: Path, settings: Settings) -> dict[str, Any]:
    dataset = load_dataset(path)
    raw = await build_embedder(settings)
    cache = EmbeddingCache(cache_dir, raw.name)
    embedder = CachingEmbedder(raw, cache)
    started = time.perf_counter()
    per_turn: dict[str, dict[str, dict[str, float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as directory:
            index = await build_index(dataset, embedder, Path(directory))
            for strategy_name, strategy in (
                ("stateless", STATELESS),
                ("default blend", default_strategy(settings)),
            ):
                for turn in dataset.scored_turns:
                    plan = (await plan_turn(turn, strategy, embedder, None)).service
                    assert plan is not None
                    query = search_query(
                        plan, DEPTH, hybrid=True, fusion_weights=settings.fusion_weights
                    )
                    hits = index.search_sync(query)
                    ids = [h.chunk.id for h in hits]
                    passages = np.vstack([h.embedding for h in hits])  # type: ignore[misc]
                    for variant, ranking in (
                        await orders(
                            turn, plan, ids, passages, embedder, strategy_name != "stateless"
                        )
                    ).items():
                        key = f"{strategy_name} | {variant}"
                        per_turn.setdefault(key, {})[turn.key] = turn_metrics(
                            ranking, turn.relevant_ids
                        )
    finally:
        cache.save()
        await raw.aclose()
    turns = dataset.scored_turns
    splits = {
        "turn_1": [t for t in turns if t.turn == 1],
        "follow_ups": [t for t in turns if t.is_follow_up],
    }
    rows = []
    for key, values in per_turn.items():
        strategy_name, variant = key.split(" | ")
        off = per_turn[f"{strategy_name} | off"]
        row: dict[str, Any] = {"strategy": strategy_name, "variant": variant}
        for split, members in splits.items():
            recall = [values[t.key]["R@5"] for t in members]
            row[split] = {
                "R@5": statistics.fmean(recall),
                "minus_off": paired_bootstrap(
                    recall,
                    [off[t.key]["R@5"] for t in members],
                    [t.conversation_id for t in members],
                    samples=1000,
                ),
            }
        rows.append(row)
    return {
        "dataset": dataset.summary(),
        "depth": DEPTH,
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }


def print_table(name: str, result: dict[str, Any]) -> None:
    print(f"\n## {name}\n")
    print("| plan | reorder | turn 1 R@5 | follow-up R@5 | follow-up minus off [95%] |")
    print("|---|---|---|---|---|")
    for row in result["rows"]:
        diff = row["follow_ups"]["minus_off"]
        print(
            f"| {row['strategy']} | {row['variant']} | {row['turn_1']['R@5']:.3f} | "
            f"{row['follow_ups']['R@5']:.3f} | {diff['mean']:+.3f} "
            f"[{diff['low']:+.3f}, {diff['high']:+.3f}] |"
        )


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dataset",
        type=Path,
        action="append",
        required=True,
        help="a dataset in the MTRAG layout, such as MTRAG's ClapNQ or "
        "benchmarks/datasets/handbook-lab: a directory holding corpus.jsonl and "
        "conversations.jsonl (see 'Getting the datasets' in site/docs/benchmarks.md); "
        "repeat for each dataset",
    )
    parser.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "rerank_query.json")
    args = parser.parse_args(argv)
    start_run()
    settings = Settings()
    results = {}
    for path in args.dataset:
        results[path.name] = await run_dataset(path, args.cache_dir, settings)
        print_table(path.name, results[path.name])
    document = {
        "command": "python benchmarks/rerank_query.py " + " ".join(sys.argv[1:]),
        "fusion": {"weights": list(settings.fusion_weights), "candidates_per_leg": 50},
        "datasets": results,
    }
    write_result(args.output, document)
    print(f"\nwrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
