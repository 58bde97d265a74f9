"""Choose the shipped follow-up configuration on ClapNQ and Govt, with reference and own history.

    .venv/bin/python benchmarks/follow_up_selection.py \\
        --datasets path/to/mtrag-clapnq path/to/mtrag-govt \\
        [--grid fixed|adaptive|hedged|gated] [--cache-dir benchmarks/.cache] \\
        [--passage-context title]

Every candidate of the grid (`fixed_grid`, the fixed settings the shipped one was chosen
from; `adaptive_grid`, the shipped setting against the adaptive mechanisms; `hedged_grid`,
the shipped setting against hedging dense legs; `gated_grid`, the shipped setting with the
self-contained check at four thresholds), and stateless
and the gold rewrite (the references), is
ranked with the product's code under the shipped retrieval (hybrid, RRF weights 1 / 0.2,
50 passages per leg, no reranker, depth 10) on each dataset with reference history (the
dataset's assistant turns) and with own history (each earlier assistant turn replaced by
the first 800 characters of the passage the same configuration ranked first at that turn;
`chatqna.evaluation.live`). The choice follows `experiments/selection.py` beside it, the
protocol written before this run: one score (the mean over the four cells of the
follow-up R@5 gain over stateless), ties by paired 95% intervals over conversations going
to the simpler setting, then the leave-one-domain-out check. Prints the tables; writes
`results/follow_up_selection.json` (or `--output`), the grid's run under its name in
the file's `configurations`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from experiments.selection import (
    DEV_DATASETS,
    HISTORY_KINDS,
    Cell,
    choose,
    leave_one_domain_out,
    simplicity,
)
from provenance import start_run, write_result

from chatqna.backends.local_embedder import OnnxMiniLMEmbedder
from chatqna.backends.protocols import SearchQuery
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache
from chatqna.evaluation.dataset import Dataset, load_dataset
from chatqna.evaluation.follow_up_variants.candidates import ANSWER_TERMS, corpus_idf
from chatqna.evaluation.live import dialogues, passage_answerer
from chatqna.evaluation.metrics import paired_bootstrap
from chatqna.evaluation.modes import CorpusSignals, Mode, ModeResult
from chatqna.evaluation.progress import stderr_progress
from chatqna.evaluation.runner import OwnHistory, build_index, plan_all, rank_with_history
from chatqna.evaluation.strategies import SEED, QueryStrategy
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.fusion import FUSION_CANDIDATES

HERE = Path(__file__).resolve().parent
DEPTH = 10
STATELESS = QueryStrategy("stateless")
GOLD = QueryStrategy("condense_gold")


def blend(roles: str, history_turns: int, bm25: float = 0.0, **values: Any) -> QueryStrategy:
    """A blend of the `roles`' last `history_turns` messages, newest first, at alpha 0.7
    unless `values` say otherwise (with the history-aware BM25 leg at `bm25`)."""
    config = replace(
        SEED,
        history_turns=history_turns,
        history_order="newest_first",
        history_roles=roles,
        bm25_history_weight=bm25,
        **values,
    )
    return QueryStrategy("blend", config)


def varied(strategy: QueryStrategy, **values: Any) -> QueryStrategy:
    """`strategy` with other multi-turn `values`."""
    return replace(strategy, config=replace(strategy.config, **values))


SHIPPED_BEFORE = blend("user", 2, 0.3)


def fixed_grid() -> list[QueryStrategy]:
    """The candidates, fixed before the run: the user's questions (2 of them, as shipped
    before), both roles in one text (2 or 4 messages), both roles as separate inputs (2 or 4
    messages, the answers' share 0.25 or 0.5); alpha 0.7 or 0.8; history-aware BM25 at 0
    or 0.3. Newest first throughout."""
    shapes: list[tuple[str, int, float]] = [("user", 2, 0.5)]
    shapes += [("user_assistant", n, 0.5) for n in (2, 4)]
    shapes += [("separate", n, w) for n in (2, 4) for w in (0.25, 0.5)]
    return [
        blend(roles, n, bm25, alpha=alpha, assistant_weight=share)
        for roles, n, share in shapes
        for alpha in (0.7, 0.8)
        for bm25 in (0.0, 0.3)
    ]


PLAIN = blend("user_assistant", 2)
SHIPPED = varied(PLAIN, bm25_history_weight=0.3)
# What the service ships since the gated run: the same with the self-contained check at 0.4
# (`MULTI_TURN_SELF_CONTAINED_SIMILARITY`); reported in the leave-one-domain-out table.
SERVED = varied(SHIPPED, self_contained_similarity=0.4)


def adaptive_grid() -> list[QueryStrategy]:
    """The adaptive candidates, fixed before their run: the shipped setting and the rule's
    earlier choice (both sides, 2 messages, newest first, alpha 0.7, with and without the
    history-aware BM25 leg), the shipped setting with an alpha set per turn from the
    follow-up's content words (`content_word_alpha`) or from its own dense top-1 cosine
    (`top_score_alpha`), with the previous answer's 5 most
    informative terms beside the earlier questions in the BM25 leg, and with both; and the
    rule's earlier choice with the answer's terms instead of the questions in that leg."""
    words = replace(SHIPPED, alpha_rule="content_words")
    return [
        PLAIN,
        SHIPPED,
        words,
        replace(SHIPPED, alpha_rule="top_score"),
        replace(SHIPPED, answer_terms=ANSWER_TERMS),
        replace(words, answer_terms=ANSWER_TERMS),
        replace(PLAIN, answer_terms=ANSWER_TERMS),
    ]


def hedged_grid() -> list[QueryStrategy]:
    """The hedging candidates, fixed before their run: the shipped setting; the shipped
    setting with a second dense leg searching with the follow-up's own vector, fused at 0.5
    or 1 times the dense leg's RRF weight; and the user's 2 questions in the blend (BM25
    history 0.3) with the previous assistant message searched as a dense leg of its own at
    0.25 or 0.5 times the dense leg's weight, instead of being blended."""
    questions = varied(SHIPPED, history_roles="user")
    return [
        SHIPPED,
        replace(SHIPPED, query_leg_weight=0.5),
        replace(SHIPPED, query_leg_weight=1.0),
        replace(questions, answer_leg_weight=0.25),
        replace(questions, answer_leg_weight=0.5),
    ]


def gated_grid() -> list[QueryStrategy]:
    """The self-contained candidates, fixed before their run: the blend before the check
    (both sides, 2 messages, newest first, alpha 0.7, BM25 history 0.3), and the same with
    the check at 0.3, 0.4, 0.5 and 0.6: a follow-up whose cosine with the previous user
    question reaches the threshold is searched on its own (stateless). 0.4 and 0.5 were
    first tried on these datasets, after a look at the blend's gain by that cosine's
    quartiles; 0.3 and 0.6 bracket them."""
    before = varied(SHIPPED, self_contained_similarity=0.0)
    return [before, *(varied(before, self_contained_similarity=t) for t in (0.3, 0.4, 0.5, 0.6))]


GRIDS = {
    "fixed": fixed_grid,
    "adaptive": adaptive_grid,
    "hedged": hedged_grid,
    "gated": gated_grid,
}


def shipped_mode(strategy: QueryStrategy, history: str) -> Mode:
    return Mode(strategy, True, False, 0.2, FUSION_CANDIDATES, history=history)


def top_score(index: EmbeddedHybridIndex) -> Callable[[str, np.ndarray], float]:
    """The dense top-1 cosine of a text searched alone (0 on an empty index)."""

    def score(text: str, vector: np.ndarray) -> float:
        hits = index.search_sync(SearchQuery(text, vector, 1, False))
        return hits[0].scores["dense"] if hits else 0.0

    return score


async def rank_dataset(
    dataset: Dataset, embedder: CachingEmbedder, context: str, candidates: list[QueryStrategy]
) -> dict[str, dict[str, ModeResult]]:
    """Every candidate and reference under both history kinds: `{history: {label: result}}`."""
    progress = stderr_progress()
    turns = dataset.scored_turns
    texts = {p.id: p.text for p in dataset.passages}
    chunks = [p.chunk(dataset.name, i, context) for i, p in enumerate(dataset.passages)]
    results: dict[str, dict[str, ModeResult]] = {kind: {} for kind in HISTORY_KINDS}
    with tempfile.TemporaryDirectory() as directory:
        index = await build_index(dataset, embedder, Path(directory), progress, context=context)
        signals = CorpusSignals(corpus_idf([c.indexed_text for c in chunks]), top_score(index))
        own = OwnHistory(
            dialogues(dataset, turns), passage_answerer(texts), embedder, None, progress, signals
        )
        for strategy in [STATELESS, GOLD, *candidates]:
            plans = await plan_all(turns, strategy, embedder, None, progress, signals)
            for kind in HISTORY_KINDS:
                mode = shipped_mode(strategy, kind)
                result, _ = await rank_with_history(mode, turns, plans, index, None, DEPTH, own)
                results[kind][strategy.label] = result
    return results


def cells_of(dataset: Dataset, ranked: dict[str, dict[str, ModeResult]]) -> list[Cell]:
    follow = [t for t in dataset.scored_turns if t.is_follow_up]
    cells = []
    for kind in HISTORY_KINDS:
        base = np.array([ranked[kind][STATELESS.label].per_turn[t.key]["R@5"] for t in follow])
        gains = {
            label: np.array([result.per_turn[t.key]["R@5"] for t in follow]) - base
            for label, result in ranked[kind].items()
        }
        cells.append(Cell(dataset.name, kind, tuple(t.conversation_id for t in follow), gains))
    return cells


def cell_table(
    datasets: list[Dataset], ranked: dict[str, dict[str, dict[str, ModeResult]]], labels: list[str]
) -> list[dict[str, Any]]:
    """Follow-up R@5 per dataset and history, with the paired difference against stateless
    and first-turn identity with stateless."""
    rows = []
    for dataset in datasets:
        follow = [t for t in dataset.scored_turns if t.is_follow_up]
        first = [t for t in dataset.scored_turns if t.turn == 1]
        groups = [t.conversation_id for t in follow]
        for kind in HISTORY_KINDS:
            base = ranked[dataset.name][kind][STATELESS.label]
            for label in labels:
                result = ranked[dataset.name][kind][label]
                values = [result.per_turn[t.key]["R@5"] for t in follow]
                diff = paired_bootstrap(
                    values, [base.per_turn[t.key]["R@5"] for t in follow], groups, samples=2000
                )
                rows.append(
                    {
                        "dataset": dataset.name,
                        "history": kind,
                        "label": label,
                        "follow_up_R@5": float(np.mean(values)),
                        "minus_stateless": diff,
                        "turn_1_equals_stateless": all(
                            result.rankings[t.key] == base.rankings[t.key] for t in first
                        ),
                    }
                )
    return rows


def markdown(document: dict[str, Any]) -> str:
    lines = [
        f"chosen: {document['chosen']}",
        f"runner-up: {document['runner_up']}",
        f"best score: {document['best']}",
        "",
        "| setting | score | ties best | " + " | ".join(document["cell_names"]) + " |",
        "|---|---|---|" + "---|" * len(document["cell_names"]),
    ]
    for row in document["candidates"]:
        gains = " | ".join(f"{g:+.3f}" for g in row["gains"])
        lines.append(f"| {row['label']} | {row['score']:+.3f} | {row['tie']} | {gains} |")
    lines += ["", "| dataset | history | setting | follow-up R@5 | minus stateless | turn 1 = |"]
    lines.append("|---|---|---|---|---|---|")
    for row in document["cells"]:
        d = row["minus_stateless"]
        lines.append(
            f"| {row['dataset']} | {row['history']} | {row['label']} | "
            f"{row['follow_up_R@5']:.3f} | {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] "
            f"| {row['turn_1_equals_stateless']} |"
        )
    lines += ["", "| held out | row | setting | gain where chosen | gain held out | kept |"]
    lines.append("|---|---|---|---|---|---|")
    for row in document["lodo"]:
        kept = "-" if row["kept"] is None else f"{row['kept']:.2f}"
        lines.append(
            f"| {row['held_out']} | {row['row']} | {row['label']} | "
            f"{row['gain_tuned_on']:+.3f} | {row['gain_held_out']:+.3f} | {kept} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--datasets",
        nargs="+",
        type=Path,
        required=True,
        help="MTRAG's ClapNQ and Govt datasets (mtrag-clapnq, mtrag-govt): directories "
        "holding corpus.jsonl and conversations.jsonl (see 'Getting the datasets' in "
        "site/docs/benchmarks.md)",
    )
    parser.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    parser.add_argument("--passage-context", choices=("title", "none"), default="title")
    parser.add_argument("--grid", choices=tuple(GRIDS), default="fixed")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    start_run()
    candidates = GRIDS[args.grid]()
    output = args.output or HERE / "results" / "follow_up_selection.json"
    datasets = [load_dataset(path) for path in args.datasets]
    unknown = [d.name for d in datasets if d.name not in DEV_DATASETS]
    if unknown:
        sys.exit(f"not a development dataset of the protocol: {', '.join(unknown)}")
    raw = OnnxMiniLMEmbedder()
    cache = EmbeddingCache(args.cache_dir, raw.name)
    embedder = CachingEmbedder(raw, cache)
    ranked = {}
    try:
        for dataset in datasets:
            ranked[dataset.name] = await rank_dataset(
                dataset, embedder, args.passage_context, candidates
            )
            cache.save()
    finally:
        cache.save()
        await raw.aclose()
    cells = [cell for dataset in datasets for cell in cells_of(dataset, ranked[dataset.name])]
    decision = choose(cells, candidates)
    chosen, runner_up = decision["chosen"], decision["runner_up"]
    served = SERVED if SERVED in candidates else None
    lodo = leave_one_domain_out(cells, candidates, chosen, runner_up, shipped=served)
    references = [GOLD.label, SHIPPED_BEFORE.label] if args.grid == "fixed" else [GOLD.label]
    labels = list(dict.fromkeys([*references, chosen.label, runner_up.label]))
    if args.grid != "fixed":
        labels = list(dict.fromkeys([*labels, *(c.label for c in candidates)]))
    document = {
        "command": " ".join(["benchmarks/follow_up_selection.py", *sys.argv[1:]]),
        "passage_context": args.passage_context,
        "grid": args.grid,
        "chosen": chosen.label,
        "runner_up": runner_up.label,
        "best": decision["best"].label,
        "cell_names": [f"{c.dataset} {c.history}" for c in cells],
        "candidates": sorted(
            (
                {
                    "label": c.label,
                    "score": decision["scores"][c.label],
                    "tie": c in decision["ties"],
                    "simplicity": list(simplicity(c)),
                    "gains": [float(cell.gains[c.label].mean()) for cell in cells],
                }
                for c in candidates
            ),
            key=lambda row: -row["score"],
        ),
        "references": {
            label: [float(cell.gains[label].mean()) for cell in cells] for label in references
        },
        "cells": cell_table(datasets, ranked, labels),
        "lodo": lodo,
    }
    write_result(output, document, configuration=args.grid)
    print(markdown(document))
    print(f"json: {output}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
