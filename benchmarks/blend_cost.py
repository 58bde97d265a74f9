"""Blend at less embedding cost: cached per-message history vectors vs the joined history text.

    .venv/bin/python benchmarks/blend_cost.py \\
        --dataset path/to/mtrag-clapnq [--dataset DIR ...] [--cache-dir benchmarks/.cache]

The service's blend embeds the follow-up and the joined history window (its messages,
newest first, as `Settings` configures them) in one call, and mixes the two vectors with
`MULTI_TURN_BLEND_ALPHA`. The alternative embeds each history message on its own,
which a service can cache by text (each earlier question was embedded when it was asked),
and combines the message vectors into the history vector: `mean` (equal weights) or
`newest` (weights 1, 1/2, 1/4, ... newest first), then the same alpha. Everything else is
the service's plan (`plan_turn` under the shipped defaults: BM25 with the earlier
questions, fusion weights, 50 per leg), retrieved from the embedded index, depth 10.

Reports follow-up Recall@5 per variant with the paired difference to today's path, and
the embedding stage of a follow-up on the packaged MiniLM: the joined path's one call of
two inputs against the query alone (every history message cached) and against the query
plus each history message (nothing cached), three passes over the follow-ups.
Writes `results/blend_cost.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from chatqna.backends.protocols import Embedder  # noqa: E402
from chatqna.backends.tei import l2_normalise  # noqa: E402
from chatqna.composition import build_embedder  # noqa: E402
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache  # noqa: E402
from chatqna.evaluation.compare import default_strategy  # noqa: E402
from chatqna.evaluation.dataset import EvalTurn, load_dataset  # noqa: E402
from chatqna.evaluation.metrics import paired_bootstrap, turn_metrics  # noqa: E402
from chatqna.evaluation.modes import plan_turn  # noqa: E402
from chatqna.evaluation.runner import build_index  # noqa: E402
from chatqna.multiturn.blend import blend_vectors, history_text  # noqa: E402
from chatqna.pipeline.sources import search_query  # noqa: E402
from chatqna.settings import Settings  # noqa: E402

DEPTH = 10
NOISE = 0.005
COMBINERS = ("mean", "newest")


def window_texts(turn: EvalTurn, settings: Settings) -> list[str]:
    """The blend's history messages, newest first, as the joined text would list them."""
    window = turn.conversation().window(
        settings.multi_turn_history_turns, settings.multi_turn_history_roles
    )
    texts = [m.content.strip() for m in window if m.content.strip()]
    return texts[::-1] if settings.multi_turn_history_order == "newest_first" else texts


def combine(vectors: np.ndarray, how: str, newest_first: bool) -> np.ndarray:
    """The history vector from per-message vectors (rows, in window order)."""
    count = len(vectors)
    if how == "mean":
        weights = np.ones(count, np.float32)
    else:
        ranks = np.arange(count) if newest_first else np.arange(count)[::-1]
        weights = (0.5**ranks).astype(np.float32)
    mixed = (weights[:, None] * vectors).sum(axis=0)
    combined: np.ndarray = l2_normalise(mixed.reshape(1, -1))[0]
    return combined


async def run_dataset(path: Path, cache_dir: Path, settings: Settings) -> dict[str, Any]:
    dataset = load_dataset(path)
    raw = await build_embedder(settings)
    cache = EmbeddingCache(cache_dir, raw.name)
    embedder = CachingEmbedder(raw, cache)
    strategy = default_strategy(settings)
    newest_first = settings.multi_turn_history_order == "newest_first"
    per_variant: dict[str, dict[str, float]] = {}
    follow_ups = [t for t in dataset.scored_turns if t.is_follow_up]
    try:
        with tempfile.TemporaryDirectory() as directory:
            index = await build_index(dataset, embedder, Path(directory))
            for turn in follow_ups:
                plan = (await plan_turn(turn, strategy, embedder, None)).service
                assert plan is not None
                texts = window_texts(turn, settings)
                vectors: dict[str, np.ndarray] = {"joined text (today)": plan.embedding}
                if texts:
                    query = (await embedder.embed([turn.query]))[0]
                    messages = await embedder.embed(texts)
                    for how in COMBINERS:
                        history = combine(messages, how, newest_first)
                        vectors[f"per message, {how}"] = blend_vectors(
                            query, history, settings.multi_turn_blend_alpha
                        )
                else:
                    for how in COMBINERS:
                        vectors[f"per message, {how}"] = plan.embedding
                for variant, vector in vectors.items():
                    query = search_query(
                        plan, DEPTH, hybrid=True, fusion_weights=settings.fusion_weights
                    )
                    hits = index.search_sync(replace(query, embedding=vector))
                    ranking = [h.chunk.id for h in hits]
                    per_variant.setdefault(variant, {})[turn.key] = turn_metrics(
                        ranking, turn.relevant_ids
                    )["R@5"]
    finally:
        cache.save()
    timings = await embedding_stage(raw, follow_ups, settings)
    await raw.aclose()
    today = per_variant["joined text (today)"]
    groups = [t.conversation_id for t in follow_ups]
    rows = []
    for variant, values in per_variant.items():
        recall = [values[t.key] for t in follow_ups]
        diff = paired_bootstrap(recall, [today[t.key] for t in follow_ups], groups, samples=1000)
        rows.append(
            {
                "variant": variant,
                "follow_up_R@5": round(statistics.fmean(recall), 4),
                "minus_today": diff,
                "within_noise": abs(diff["mean"]) <= NOISE,
            }
        )
    return {"dataset": dataset.summary(), "follow_ups": len(follow_ups), "rows": rows} | {
        "embedding_stage_ms": timings
    }


async def embedding_stage(
    embedder: Embedder, turns: Sequence[EvalTurn], settings: Settings, repeat: int = 3
) -> dict[str, Any]:
    """Median ms of a follow-up's embedding call on each path (the raw embedder, no cache)."""
    paths: dict[str, list[float]] = {
        "joined: query + joined history, one call": [],
        "per message, cached: query only": [],
        "per message, cold: query + each message, one call": [],
    }
    for _ in range(repeat):
        for turn in turns:
            texts = window_texts(turn, settings)
            if not texts:
                continue
            joined = history_text(
                [m for m in turn.history if m.content.strip() in texts],
                settings.multi_turn_history_order,
            )
            for name, inputs in (
                ("joined: query + joined history, one call", [turn.query, joined]),
                ("per message, cached: query only", [turn.query]),
                ("per message, cold: query + each message, one call", [turn.query, *texts]),
            ):
                started = time.perf_counter()
                await embedder.embed(inputs)
                paths[name].append((time.perf_counter() - started) * 1000)
    return {
        name: {
            "median": round(statistics.median(values), 3),
            "p95": round(sorted(values)[int(len(values) * 0.95) - 1], 3),
            "calls": len(values),
        }
        for name, values in paths.items()
        if values
    }


def print_table(name: str, result: dict[str, Any]) -> None:
    print(f"\n## {name} ({result['follow_ups']} follow-ups)\n")
    print("| history vector | follow-up R@5 | minus today [95%] | within 0.005 |")
    print("|---|---|---|---|")
    for row in result["rows"]:
        diff = row["minus_today"]
        print(
            f"| {row['variant']} | {row['follow_up_R@5']:.3f} | {diff['mean']:+.3f} "
            f"[{diff['low']:+.3f}, {diff['high']:+.3f}] | {row['within_noise']} |"
        )
    print("\n| embedding stage of a follow-up | median ms | p95 ms |")
    print("|---|---|---|")
    for path, stats in result["embedding_stage_ms"].items():
        print(f"| {path} | {stats['median']:.2f} | {stats['p95']:.2f} |")


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
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
    parser.add_argument("--output", type=Path, default=HERE / "results" / "blend_cost.json")
    args = parser.parse_args(argv)
    start_run()
    settings = Settings.model_validate({})
    results = {}
    for path in args.dataset:
        results[path.name] = await run_dataset(path, args.cache_dir, settings)
        print_table(path.name, results[path.name])
    document = {
        "command": "python benchmarks/blend_cost.py " + " ".join(sys.argv[1:]),
        "defaults": {
            "alpha": settings.multi_turn_blend_alpha,
            "history_roles": settings.multi_turn_history_roles,
            "history_turns": settings.multi_turn_history_turns,
            "history_order": settings.multi_turn_history_order,
        },
        "datasets": results,
    }
    write_result(args.output, document)
    print(f"\nwrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
