"""Running every mode over a dataset with the product's index, fusion and reranker.

The corpus is indexed once in the embedded hybrid index (each passage one chunk, its id
the passage id). Query plans are formed once per strategy and reused under every retrieval
switch (hybrid at each fusion weight and per-leg depth, dense only; each with and without
the reranker). Each turn's ranking is the top `depth` ids after retrieval (and reranking),
scored by `chatqna.evaluation.metrics`. `chatqna.evaluation.compare` then sets the shipped
defaults against the references, with paired intervals.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from chatqna.backends.protocols import ChatLLM, Embedder, Reranker, SourceBatch
from chatqna.evaluation.compare import Reference, compare_references
from chatqna.evaluation.dataset import Dataset, EvalTurn
from chatqna.evaluation.live import (
    Answerer,
    Dialogue,
    dialogues,
    passage_answerer,
    replay_mode,
    retrieve,
)
from chatqna.evaluation.metrics import turn_metrics
from chatqna.evaluation.modes import (
    BenchPlan,
    CorpusSignals,
    Mode,
    ModeResult,
    plan_turn,
    reads_answers,
)
from chatqna.evaluation.progress import Progress
from chatqna.evaluation.strategies import QueryStrategy
from chatqna.retrieval.embedded.index import EXACT_MAX_CHUNKS, EmbeddedHybridIndex
from chatqna.retrieval.fusion import FUSION_CANDIDATES


async def build_index(
    dataset: Dataset,
    embedder: Embedder,
    directory: Path,
    progress: Progress | None = None,
    *,
    exact_max: int = EXACT_MAX_CHUNKS,
    context: str = "title",
) -> EmbeddedHybridIndex:
    """Index the corpus, one chunk per passage, embedding in batches what ingestion embeds
    (`context`: what each passage's legs see besides its text, `title` or `none`). Past
    `exact_max` passages the dense leg is the HNSW graph, waited for before this returns."""
    chunks = [p.chunk(dataset.name, i, context) for i, p in enumerate(dataset.passages)]
    texts = [chunk.indexed_text for chunk in chunks]
    tick = progress("embedding corpus", len(texts)) if progress else None
    rows = []
    for start in range(0, len(texts), 64):
        batch = texts[start : start + 64]
        rows.append(await embedder.embed(batch))
        if tick:
            tick(len(batch))
    matrix = np.vstack(rows)
    index = await EmbeddedHybridIndex.open(
        directory,
        embedder_name=embedder.name,
        dimension=int(matrix.shape[1]),
        exact_max=exact_max,
    )
    await index.replace_sources([SourceBatch(dataset.name, chunks, matrix)])
    await asyncio.to_thread(index.wait_for_graph)
    return index


async def plan_all(
    turns: Sequence[EvalTurn],
    strategy: QueryStrategy,
    embedder: Embedder,
    llm: ChatLLM | None,
    progress: Progress | None = None,
    signals: CorpusSignals | None = None,
) -> dict[str, BenchPlan]:
    tick = progress(f"planning {strategy.label}", len(turns)) if progress else None
    plans = {}
    for turn in turns:
        plans[turn.key] = await plan_turn(turn, strategy, embedder, llm, signals=signals)
        if tick:
            tick(1)
    return plans


async def rank_mode(
    mode: Mode,
    turns: Sequence[EvalTurn],
    plans: dict[str, BenchPlan],
    index: EmbeddedHybridIndex,
    reranker: Reranker | None,
    depth: int,
) -> ModeResult:
    """Rank every turn under `mode`; with `mode.rerank` the service's reranker reorders the
    candidates against the plan's rerank query (without a reranker, the fused order stays,
    as it does in the service)."""
    result = ModeResult(mode)
    for turn in turns:
        plan = plans[turn.key]
        if plan.failure is not None:
            result.failures[turn.key] = plan.failure
        hits = await retrieve(mode, plan, index, reranker, depth)
        ranking = [hit.chunk.id for hit in hits]
        result.rankings[turn.key] = ranking
        result.per_turn[turn.key] = turn_metrics(ranking, turn.relevant_ids)
    return result


@dataclass
class OwnHistory:
    """What the own-history replay needs: the conversations and how a turn is answered."""

    conversations: list[Dialogue]
    answer: Answerer
    embedder: Embedder
    llm: ChatLLM | None
    progress: Progress | None = None
    signals: CorpusSignals | None = None


async def rank_with_history(
    mode: Mode,
    turns: Sequence[EvalTurn],
    plans: dict[str, BenchPlan],
    index: EmbeddedHybridIndex,
    reranker: Reranker | None,
    depth: int,
    own: OwnHistory | None,
) -> tuple[ModeResult, dict[str, BenchPlan]]:
    """`rank_mode` for reference history; for own history (`mode.history == "own"`) the
    turn-by-turn replay, or the reference ranking when the query never reads answers."""
    if mode.history != "own" or own is None or not reads_answers(mode.query):
        result = await rank_mode(mode, turns, plans, index, reranker, depth)
        return result, plans
    tick = own.progress(f"replaying {mode.label}", len(turns)) if own.progress else None
    return await replay_mode(
        mode,
        own.conversations,
        index,
        own.embedder,
        own.llm,
        reranker,
        own.answer,
        depth=depth,
        tick=tick,
        signals=own.signals,
    )


def cost_summary(turns: Sequence[EvalTurn], plans: dict[str, BenchPlan]) -> dict[str, Any]:
    follow = [plans[t.key] for t in turns if t.is_follow_up]
    every = [plans[t.key] for t in turns]
    return {
        "embedding_inputs_per_turn": statistics.fmean(p.embedding_inputs for p in every),
        "embedding_inputs_per_follow_up": statistics.fmean(p.embedding_inputs for p in follow)
        if follow
        else 0.0,
        "llm_calls_per_turn": statistics.fmean(p.llm_calls for p in every),
        "failed_turns": sum(1 for p in every if p.failure is not None),
    }


async def measure_latency(
    turns: Sequence[EvalTurn],
    strategies: Sequence[QueryStrategy],
    embedder: Embedder,
    llm: ChatLLM | None,
    plans: dict[str, dict[str, BenchPlan]],
    sample: int = 30,
) -> dict[str, float]:
    """Median query-planning milliseconds per follow-up turn, with the uncached embedder.

    LLM rewrites are not repeated: their measured time from the main run is reused.
    """
    follow = [t for t in turns if t.is_follow_up][:sample]
    medians: dict[str, float] = {}
    for strategy in strategies:
        if strategy.strategy == "condense_llm":
            times = [plans[strategy.label][t.key].milliseconds for t in follow]
        else:
            times = []
            for turn in follow:
                started = time.perf_counter()
                await plan_turn(turn, strategy, embedder, llm)
                times.append((time.perf_counter() - started) * 1000)
        medians[strategy.label] = statistics.median(times) if times else 0.0
    return medians


@dataclass
class Ranker:
    """Ranks any mode of one run: its turns, their plans by strategy, the index, the
    reranker and the own-history replay."""

    turns: Sequence[EvalTurn]
    plans: dict[str, dict[str, BenchPlan]]
    index: EmbeddedHybridIndex
    reranker: Reranker | None
    depth: int
    own: OwnHistory

    async def rank(self, mode: Mode) -> tuple[ModeResult, dict[str, BenchPlan]]:
        plans = self.plans[mode.query.label]
        return await rank_with_history(
            mode, self.turns, plans, self.index, self.reranker, self.depth, self.own
        )


async def rank_every_mode(
    ranker: Ranker,
    strategies: Sequence[QueryStrategy],
    switches: Sequence[tuple[bool, float, int, float]],
    histories: Sequence[str],
    latency: dict[str, float],
    samples: int,
) -> list[dict[str, Any]]:
    """Every strategy under every switch (hybrid, BM25 weight, per-leg depth, dense weight),
    with the reranker and without, for every history kind."""
    modes = []
    for kind in histories:
        for strategy in strategies:
            for hybrid, weight, legs, dense in switches:
                for rerank in (True, False):
                    mode = Mode(strategy, hybrid, rerank, weight, legs, dense, history=kind)
                    ranked, used = await ranker.rank(mode)
                    described = describe_mode(ranked, ranker.turns, used, latency, samples)
                    modes.append({**described, "history": kind})
    return modes


async def compare_every_history(
    ranker: Ranker, references: Sequence[Reference], histories: Sequence[str], samples: int
) -> dict[str, dict[str, Any]]:
    """The configuration under test against the references, under each history kind."""
    comparisons = {}
    for kind in histories if references else ():
        ranked = [(await ranker.rank(replace(r.mode, history=kind)))[0] for r in references]
        comparisons[kind] = compare_references(references, ranked, ranker.turns, samples=samples)
    return comparisons


async def run_benchmark(
    dataset: Dataset,
    strategies: Sequence[QueryStrategy],
    embedder: Embedder,
    raw_embedder: Embedder,
    llm: ChatLLM | None,
    *,
    depth: int = 10,
    samples: int = 1000,
    progress: Progress | None = None,
    bm25_weights: Sequence[float] = (1.0,),
    candidates: Sequence[int] = (FUSION_CANDIDATES,),
    references: Sequence[Reference] = (),
    reranker: Reranker | None = None,
    exact_max: int = EXACT_MAX_CHUNKS,
    histories: Sequence[str] = ("reference",),
    answer: Answerer | None = None,
    passage_context: str = "title",
    dense_weight: float = 1.0,
) -> dict[str, Any]:
    """Every strategy under every switch (hybrid at each BM25 weight, per-leg depth and
    `dense_weight`, dense only; with `reranker` and without) and history kind (`reference`,
    `own`: earlier answers replaced by `answer`'s, see `chatqna.evaluation.live`), and
    `references` against the configuration under test; returns the results document.
    `exact_max` 0 ranks with the HNSW graph; `passage_context`: what passages' legs see."""
    switches = [(True, float(w), int(c), dense_weight) for w in bm25_weights for c in candidates]
    switches.append((False, 1.0, FUSION_CANDIDATES, 1.0))
    turns = dataset.scored_turns
    started = time.perf_counter()
    if answer is None:
        answer = passage_answerer({p.id: p.text for p in dataset.passages})
    own = OwnHistory(dialogues(dataset, turns), answer, embedder, llm, progress)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory)
        index = await build_index(
            dataset, embedder, path, progress, exact_max=exact_max, context=passage_context
        )
        planned = list(dict.fromkeys([*strategies, *(r.mode.query for r in references)]))
        plans = {s.label: await plan_all(turns, s, embedder, llm, progress) for s in planned}
        latency = await measure_latency(turns, planned, raw_embedder, llm, plans)
        ranker = Ranker(turns, plans, index, reranker, depth, own)
        modes = await rank_every_mode(ranker, strategies, switches, histories, latency, samples)
        comparisons = await compare_every_history(ranker, references, histories, samples)
    document: dict[str, Any] = {
        "dataset": dataset.summary(),
        "depth": depth,
        "bootstrap_samples": samples,
        "reranker": reranker.name if reranker is not None else None,
        "seconds": round(time.perf_counter() - started, 1),
        "histories": list(histories),
        "passage_context": passage_context,
        "modes": modes,
    }
    if comparisons:
        document["comparison"] = comparisons.get("reference") or next(iter(comparisons.values()))
        document["comparisons"] = comparisons
    return document


def describe_mode(
    result: ModeResult,
    turns: Sequence[EvalTurn],
    plans: dict[str, BenchPlan],
    latency: dict[str, float],
    samples: int,
) -> dict[str, Any]:
    strategy = result.mode.query
    config = strategy.config
    blend = strategy.strategy == "blend"
    baseline = latency.get("stateless", 0.0)
    return {
        "label": result.mode.label,
        "strategy": strategy.strategy,
        "alpha": config.alpha if blend else None,
        "history_turns": config.history_turns
        if strategy.strategy in ("blend", "condense_llm")
        else None,
        "hybrid": result.mode.hybrid,
        "bm25_weight": result.mode.bm25_weight,
        "candidates": result.mode.candidates if result.mode.hybrid else None,
        "order": config.history_order if blend else None,
        "roles": config.history_roles if blend else None,
        "bm25_history_weight": config.bm25_history_weight if blend else None,
        "rerank": result.mode.rerank,
        "splits": result.split(turns, samples),
        "cost": {
            **cost_summary(turns, plans),
            "planning_ms_median": round(latency.get(strategy.label, 0.0), 2),
            "added_ms_vs_stateless": round(latency.get(strategy.label, 0.0) - baseline, 2),
        },
        "failures": dict(sorted(result.failures.items())),
        "per_turn_R@5": {key: values["R@5"] for key, values in result.per_turn.items()},
    }
