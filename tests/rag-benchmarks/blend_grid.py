"""How the blend defaults were chosen: the grid, the selection rule, and a check on its luck.

    .venv/bin/python tests/rag-benchmarks/blend_grid.py \\
        [--dataset ../shared/datasets/mtrag-clapnq] [--cache-dir tests/rag-benchmarks/.cache]

Every configuration of the grid is ranked with the product's code (`blend_query` for the
dense vector, the embedded index's dense search and BM25 with the history-aware leg,
`reciprocal_rank_fusion`), without the reranker, at depth 10:

    alpha                 0.65, 0.70, 0.75, 0.80
    history               user+assistant, 4 / 6 / 8 messages (2-4 exchanges), newest first
                          or oldest first; user questions only, 2 / 3 / 4, newest first
    BM25 fusion weight    0.1, 0.2, 0.3, 0.5, 1.0 (dense weight 1)
    passages per leg      10 (the seed: each leg's best k) or 50 (FUSION_CANDIDATES)
    history-BM25 weight   0 (plain BM25), 0.2, 0.3, 0.5 (the earlier questions' words)

A turn 1 has no history, so under a configuration it is ranked as stateless under the same
retrieval. The reranker is off, which is also what the shipped configuration reranks with
on the embedded default (it keeps the fused order; see `rerank_query.py`).

The selection rule, fixed before looking at the results, over every `--dataset` given
(ClapNQ and the handbook lab by default) together: score each configuration by the mean,
over the datasets, of its mean Recall@5 over all scored turns (first turns and follow-ups
alike, because the fusion settings serve every turn); every configuration within `NOISE`
(0.005) of the best score is a tie, and among the ties the simplest wins: without the
history-aware BM25 leg before with it, then the shortest history window, then the higher
score. Reported with it: the best 15, the mean of each value of each dimension over the
grid, the margin over stateless under the same retrieval per dataset, and a repeated
two-fold cross-validation over conversations (choose on one half of every dataset with
the same rule, score the choice on the other halves) that estimates how much of the chosen
margin is the luck of picking the best of many. Prints a table; writes
`results/blend_grid.json`. A run answers embeddings from the benchmark's cache (a few
minutes on 2 cores when the cache is warm).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatqna.backends.local_embedder import OnnxMiniLMEmbedder
from chatqna.backends.protocols import SearchQuery
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache
from chatqna.evaluation.dataset import EvalTurn, load_dataset
from chatqna.evaluation.metrics import turn_metrics
from chatqna.evaluation.runner import build_index
from chatqna.multiturn.blend import blend_query, earlier_questions
from chatqna.multiturn.history import Conversation
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.fusion import FUSION_CANDIDATES, reciprocal_rank_fusion
from chatqna.retrieval.query import WeightedQuery

HERE = Path(__file__).resolve().parent
DEPTH = 10
ALPHAS = (0.65, 0.7, 0.75, 0.8)
HISTORIES = [
    ("user_assistant", n, order) for n in (4, 6, 8) for order in ("newest_first", "chronological")
] + [("user", n, "newest_first") for n in (2, 3, 4)]
BM25_WEIGHTS = (0.1, 0.2, 0.3, 0.5, 1.0)
LEGS = (DEPTH, FUSION_CANDIDATES)
HISTORY_WEIGHTS = (0.0, 0.2, 0.3, 0.5)
NOISE = 0.005


@dataclass(frozen=True)
class Config:
    """One grid point."""

    alpha: float
    roles: str
    history_turns: int
    order: str
    bm25_weight: float
    legs: int
    bm25_history_weight: float


class LazyEmbedder:
    """The packaged MiniLM, loaded only if the cache misses a text."""

    name = "all-MiniLM-L6-v2-onnx-int8"
    max_batch = 32

    def __init__(self) -> None:
        self.inner: OnnxMiniLMEmbedder | None = None

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.inner is None:
            self.inner = OnnxMiniLMEmbedder()
        return await self.inner.embed(texts)

    async def describe(self) -> dict[str, Any]:
        return {"kind": "lazy"}

    async def aclose(self) -> None:
        return None


class Rankings:
    """Per-turn dense and BM25 rankings (positions), each computed once and fused many times."""

    def __init__(self, index: EmbeddedHybridIndex) -> None:
        self.index = index
        self.vectors = index._vectors  # the index's current immutable vector set, read-only
        rows = dict(index.store.connection().execute("SELECT row, id FROM chunks").fetchall())
        self.ids = [rows[int(row)] for row in self.vectors.rows]  # chunk id per position
        self.deepest = max(LEGS)

    def dense(self, vector: np.ndarray) -> list[int]:
        cosine = self.vectors.cosine(vector)
        return [int(i) for i in self.vectors.top(cosine, self.deepest)]

    def bm25(self, turn: EvalTurn, weight: float) -> list[int]:
        history = "\n".join(earlier_questions(Conversation(turn.query, turn.history)))
        query = WeightedQuery.parse(turn.query, history, weight)
        rows, _ = self.index.lexical.top(query, self.deepest)
        return [int(p) for p in self.vectors.positions(rows) if p >= 0]

    def fuse(self, dense: list[int], bm25: list[int], config: Config) -> list[str]:
        fused = reciprocal_rank_fusion(
            [[str(i) for i in dense[: config.legs]], [str(i) for i in bm25[: config.legs]]],
            k=self.index.rrf_k,
            weights=(1.0, config.bm25_weight),
        )
        return [self.ids[int(key)] for key, _ in fused[:DEPTH]]


def grid() -> list[Config]:
    return [
        Config(a, roles, n, order, w, legs, hw)
        for a in ALPHAS
        for roles, n, order in HISTORIES
        for w in BM25_WEIGHTS
        for legs in LEGS
        for hw in HISTORY_WEIGHTS
    ]


async def rank_everything(
    turns: Sequence[EvalTurn], embedder: CachingEmbedder, rankings: Rankings
) -> dict[str, Any]:
    dense: dict[tuple[Any, ...], dict[str, list[int]]] = {}
    dense[("stateless",)] = {
        t.key: rankings.dense((await embedder.embed([t.query]))[0]) for t in turns
    }
    for alpha in ALPHAS:
        for roles, n, order in HISTORIES:
            vectors = {}
            for t in turns:
                result = await blend_query(
                    Conversation(t.query, t.history),
                    embedder,
                    enabled=True,
                    alpha=alpha,
                    history_turns=n,
                    translator=None,
                    order=order,
                    roles=roles,
                )
                vectors[t.key] = rankings.dense(result.embedding)
            dense[(alpha, roles, n, order)] = vectors
    bm25 = {w: {t.key: rankings.bm25(t, w) for t in turns} for w in HISTORY_WEIGHTS}
    return {"dense": dense, "bm25": bm25}


def recall(turn: EvalTurn, ranking: list[str]) -> float:
    return turn_metrics(ranking, turn.relevant_ids, (5,))["R@5"]


def score_grid(
    turns: Sequence[EvalTurn], ranked: dict[str, Any], rankings: Rankings
) -> tuple[dict[Config, dict[str, float]], dict[tuple[float, int], dict[str, float]]]:
    """Per configuration, R@5 of every turn (turn 1 under the same retrieval, stateless);
    per retrieval setting, stateless R@5 of every turn."""
    stateless: dict[tuple[float, int], dict[str, float]] = {}
    for w in BM25_WEIGHTS:
        for legs in LEGS:
            probe = Config(0.0, "", 0, "", w, legs, 0.0)
            stateless[(w, legs)] = {
                t.key: recall(
                    t,
                    rankings.fuse(
                        ranked["dense"][("stateless",)][t.key], ranked["bm25"][0.0][t.key], probe
                    ),
                )
                for t in turns
            }
    per_config: dict[Config, dict[str, float]] = {}
    for config in grid():
        dense = ranked["dense"][(config.alpha, config.roles, config.history_turns, config.order)]
        bm25 = ranked["bm25"][config.bm25_history_weight]
        per_config[config] = {
            t.key: recall(t, rankings.fuse(dense[t.key], bm25[t.key], config))
            if t.is_follow_up
            else stateless[(config.bm25_weight, config.legs)][t.key]
            for t in turns
        }
    return per_config, stateless


def mean_over(values: dict[str, float], keys: Sequence[str]) -> float:
    return statistics.fmean(values[k] for k in keys) if keys else float("nan")


@dataclass
class DatasetGrid:
    """One dataset's scored turns and the R@5 of every turn under every configuration."""

    name: str
    turns: Sequence[EvalTurn]
    per_config: dict[Config, dict[str, float]]
    stateless: dict[tuple[float, int], dict[str, float]]

    def score(self, config: Config, conversations: set[str] | None = None) -> float:
        keys = [
            t.key for t in self.turns if conversations is None or t.conversation_id in conversations
        ]
        return mean_over(self.per_config[config], keys)

    def margin(self, config: Config, conversations: set[str] | None = None) -> float:
        follow = [
            t.key
            for t in self.turns
            if t.is_follow_up and (conversations is None or t.conversation_id in conversations)
        ]
        base = self.stateless[(config.bm25_weight, config.legs)]
        return mean_over(self.per_config[config], follow) - mean_over(base, follow)


def simplicity(config: Config) -> tuple[bool, int]:
    """Smaller is simpler: no history-aware BM25 leg, then a shorter history window."""
    return (config.bm25_history_weight > 0.0, config.history_turns)


def choose(
    grids: Sequence[DatasetGrid], halves: Sequence[set[str] | None] | None = None
) -> tuple[Config, float]:
    """The selection rule: best mean over datasets, ties within NOISE to the simplest."""
    parts = halves if halves is not None else [None] * len(grids)
    scores = {
        config: statistics.fmean(g.score(config, h) for g, h in zip(grids, parts, strict=True))
        for config in grids[0].per_config
    }
    best = max(scores.values())
    tied = [c for c, value in scores.items() if value >= best - NOISE]
    chosen = min(tied, key=lambda c: (simplicity(c), -scores[c]))
    return chosen, scores[chosen]


def cross_validate(grids: Sequence[DatasetGrid], repeats: int) -> dict[str, Any]:
    rng = random.Random(0)
    conversations = [sorted({t.conversation_id for t in g.turns}) for g in grids]
    train_margins: dict[str, list[float]] = {g.name: [] for g in grids}
    test_margins: dict[str, list[float]] = {g.name: [] for g in grids}
    chosen = []
    for _ in range(repeats):
        splits = []
        for names in conversations:
            rng.shuffle(names)
            half = len(names) // 2
            splits.append((set(names[:half]), set(names[half:])))
        for direction in (0, 1):
            train = [split[direction] for split in splits]
            test = [split[1 - direction] for split in splits]
            best, _ = choose(grids, train)
            chosen.append(best)
            for grid_, a, b in zip(grids, train, test, strict=True):
                train_margins[grid_.name].append(grid_.margin(best, a))
                test_margins[grid_.name].append(grid_.margin(best, b))
    return {
        "repeats": repeats,
        "folds": 2 * repeats,
        "distinct_choices": len(set(chosen)),
        "per_dataset": {
            name: {
                "train_margin_mean": round(statistics.fmean(train_margins[name]), 4),
                "test_margin_mean": round(statistics.fmean(test_margins[name]), 4),
                "test_margin_range": [
                    round(min(test_margins[name]), 4),
                    round(max(test_margins[name]), 4),
                ],
            }
            for name in train_margins
        },
    }


def summarise(grids: Sequence[DatasetGrid], repeats: int) -> dict[str, Any]:
    def row(config: Config) -> dict[str, Any]:
        result: dict[str, Any] = {
            **asdict(config),
            "score": round(statistics.fmean(g.score(config) for g in grids), 4),
        }
        for g in grids:
            follow = [t.key for t in g.turns if t.is_follow_up]
            first = [t.key for t in g.turns if t.turn == 1]
            base = g.stateless[(config.bm25_weight, config.legs)]
            result[g.name] = {
                "all_R@5": round(g.score(config), 4),
                "follow_up_R@5": round(mean_over(g.per_config[config], follow), 4),
                "turn_1_R@5": round(mean_over(g.per_config[config], first), 4),
                "stateless_follow_up_R@5": round(mean_over(base, follow), 4),
                "margin": round(g.margin(config), 4),
            }
        return result

    chosen, _ = choose(grids)
    every = sorted(grids[0].per_config, key=lambda c: -statistics.fmean(g.score(c) for g in grids))
    marginals: dict[str, dict[str, float]] = {}
    for name in (
        "alpha",
        "roles",
        "history_turns",
        "order",
        "bm25_weight",
        "legs",
        "bm25_history_weight",
    ):
        groups: dict[str, list[float]] = {}
        for config in every:
            value = (
                f"{config.roles} {config.history_turns}"
                if name == "history_turns"
                else str(getattr(config, name))
            )
            groups.setdefault(value, []).append(statistics.fmean(g.score(config) for g in grids))
        marginals[name] = {k: round(statistics.fmean(v), 4) for k, v in sorted(groups.items())}
    return {
        "rule": (
            "highest mean over the datasets of mean R@5 over all scored turns (no reranker); "
            f"within {NOISE} of the best, the simplest (no history-aware BM25 leg, then the "
            "shortest history window)"
        ),
        "configurations": len(every),
        "chosen": row(chosen),
        "best_score": row(every[0]),
        "top": [row(c) for c in every[:15]],
        "marginal_score": marginals,
        "cross_validation": cross_validate(grids, repeats),
        "every_configuration": [row(c) for c in every],
    }


def check_against_the_index(
    turns: Sequence[EvalTurn], ranked: dict[str, Any], rankings: Rankings
) -> None:
    """The precomputed shortcut must rank exactly as the index's own hybrid search."""
    config = Config(0.7, "user_assistant", 4, "newest_first", 0.2, FUSION_CANDIDATES, 0.3)
    dense = ranked["dense"][("stateless",)]
    for turn in [t for t in turns if t.is_follow_up][:20]:
        history = "\n".join(earlier_questions(Conversation(turn.query, turn.history)))
        vector = rankings.state.matrix[dense[turn.key][0]]  # any vector will do
        hits = rankings.index.search_sync(
            SearchQuery(turn.query, vector, DEPTH, True, (1.0, 0.2), history, 0.3),
            candidates=config.legs,
        )
        dense_order = rankings.dense(vector)
        fused = rankings.fuse(dense_order, ranked["bm25"][0.3][turn.key], config)
        if [h.chunk.id for h in hits] != fused:
            raise AssertionError(f"the grid's shortcut disagrees with the index on {turn.key}")


def print_summary(summary: dict[str, Any], names: Sequence[str]) -> None:
    print(f"{summary['configurations']} configurations; rule: {summary['rule']}")
    print()
    head = " | ".join(f"{n} all / follow-up / margin" for n in names)
    print(f"| alpha | history | order | bm25 w | legs | hist w | score | {head} |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(names))
    for r in [summary["chosen"], *summary["top"]]:
        cells = " | ".join(
            f"{r[n]['all_R@5']:.3f} / {r[n]['follow_up_R@5']:.3f} / {r[n]['margin']:+.3f}"
            for n in names
        )
        print(
            f"| {r['alpha']} | {r['roles']} {r['history_turns']} | {r['order']} | "
            f"{r['bm25_weight']} | {r['legs']} | {r['bm25_history_weight']} | {r['score']:.4f} | "
            f"{cells} |"
        )
    print("(first row: the chosen configuration; then the best 15 by score)")
    print()
    for name, values in summary["marginal_score"].items():
        print(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
    cv = summary["cross_validation"]
    print()
    for name, values in cv["per_dataset"].items():
        print(
            f"cross-validation ({cv['folds']} folds), {name}: chosen on one half, margin over "
            f"stateless {values['train_margin_mean']:+.3f} there, "
            f"{values['test_margin_mean']:+.3f} on the other half"
        )


async def grid_for(path: Path, embedder: CachingEmbedder) -> DatasetGrid:
    dataset = load_dataset(path)
    turns = dataset.scored_turns
    with tempfile.TemporaryDirectory() as directory:
        index = await build_index(dataset, embedder, Path(directory))
        rankings = Rankings(index)
        ranked = await rank_everything(turns, embedder, rankings)
        check_against_the_index(turns, ranked, rankings)
        per_config, stateless = score_grid(turns, ranked, rankings)
    return DatasetGrid(dataset.name, turns, per_config, stateless)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, action="append")
    parser.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    parser.add_argument("--repeats", type=int, default=60, help="two-fold cross-validation rounds")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "blend_grid.json")
    args = parser.parse_args()
    paths = args.dataset or [
        HERE.parents[2] / "shared/datasets/mtrag-clapnq",
        HERE / "datasets" / "handbook-lab",
    ]
    started = time.perf_counter()
    cache = EmbeddingCache(args.cache_dir, LazyEmbedder.name)
    embedder = CachingEmbedder(LazyEmbedder(), cache)
    try:
        grids = [await grid_for(path, embedder) for path in paths]
    finally:
        cache.save()
    summary = {
        "datasets": [g.name for g in grids],
        "depth": DEPTH,
        "command": "tests/rag-benchmarks/blend_grid.py " + " ".join(sys.argv[1:]),
        "embeddings_computed": embedder.inputs_computed,
        "seconds": round(time.perf_counter() - started, 1),
        **summarise(grids, args.repeats),
    }
    print_summary(summary, [g.name for g in grids])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nwrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
