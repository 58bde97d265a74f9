"""`chatqna bench`: build the real backends, run the benchmark, write the outputs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chatqna.composition import (
    build_condense_llm,
    build_embedder,
    build_llm,
    build_reranker,
)
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache
from chatqna.evaluation.compare import shipped_references
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.live import llm_answerer
from chatqna.evaluation.modes import default_strategies
from chatqna.evaluation.report import markdown, write_outputs
from chatqna.evaluation.runner import run_benchmark
from chatqna.retrieval.fusion import FUSION_CANDIDATES
from chatqna.settings import Settings

DEFAULT_RESULTS = Path("tests/rag-benchmarks/results")


def tqdm_progress() -> Callable[[str, int], Callable[[int], None]]:
    from tqdm import tqdm

    def start(description: str, total: int) -> Callable[[int], None]:
        bar = tqdm(total=total, desc=description, file=sys.stderr, leave=False, disable=None)

        def tick(count: int) -> None:
            bar.update(count)
            if bar.n >= total:
                bar.close()

        return tick

    return start


def settings_snapshot(settings: Settings) -> dict[str, Any]:
    snapshot: dict[str, Any] = settings.model_dump(mode="json")
    return snapshot


async def run_bench_command(
    settings: Settings,
    dataset_dir: Path,
    output: Path | None,
    *,
    alphas: tuple[float, ...],
    history_turns: tuple[int, ...],
    with_llm: bool,
    samples: int,
    cache_dir: Path | None,
    command: str,
    orders: tuple[str, ...] = ("chronological",),
    bm25_weights: tuple[float, ...] = (1.0,),
    bm25_history_weights: tuple[float, ...] = (0.0,),
    roles: tuple[str, ...] = ("user_assistant",),
    candidates: tuple[int, ...] = (FUSION_CANDIDATES,),
    histories: tuple[str, ...] = ("reference",),
    passage_context: str = "title",
    assistant_weights: tuple[float, ...] = (0.5,),
) -> dict[str, Any]:
    dataset = load_dataset(dataset_dir)
    raw = await build_embedder(settings)
    cache = EmbeddingCache(cache_dir or settings.chatqna_data_dir / "bench-cache", raw.name)
    embedder = CachingEmbedder(raw, cache)
    answer_llm = await build_llm(settings) if with_llm else None
    llm = build_condense_llm(settings, answer_llm) if answer_llm is not None else None
    # The reranker the service would run with these settings (TEI_RERANKING_ENDPOINT,
    # CHATQNA_EMBEDDED_RERANKER); the embedded default has none and keeps the fused order.
    reranker = build_reranker(settings, embedder)
    started = time.perf_counter()
    try:
        results = await run_benchmark(
            dataset,
            default_strategies(
                alphas=alphas,
                history_turns=history_turns,
                with_llm=with_llm,
                orders=orders,
                bm25_history_weights=bm25_history_weights,
                roles=roles,
                assistant_weights=assistant_weights,
            ),
            embedder,
            raw,
            llm,
            samples=samples,
            progress=tqdm_progress(),
            bm25_weights=bm25_weights,
            candidates=candidates,
            references=shipped_references(settings, depth=10),
            reranker=reranker,
            exact_max=settings.chatqna_embedded_exact_max_chunks,
            histories=histories,
            # With an LLM, own history holds its real answers; without, the top passage.
            answer=llm_answerer(answer_llm) if answer_llm is not None else None,
            passage_context=passage_context,
        )
    finally:
        cache.save()
        if reranker is not None:
            await reranker.aclose()
        if llm is not None:
            await llm.aclose()
        if answer_llm is not None and answer_llm is not llm:
            await answer_llm.aclose()
        await raw.aclose()
    results["command"] = command
    results["settings"] = settings_snapshot(settings)
    results["embedder"] = {
        "name": raw.name,
        "inputs_computed": embedder.inputs_computed,
        "cache": str(cache.path),
    }
    results["condense_llm"] = llm.model if llm is not None else None
    results["seconds_total"] = round(time.perf_counter() - started, 1)
    paths = write_outputs(results, output or DEFAULT_RESULTS / dataset.name)
    print(markdown(results).split("## Every mode")[0])
    for kind, path in paths.items():
        print(f"{kind}: {path}", file=sys.stderr)
    return results


async def run_service_command(
    dataset_dir: Path, url: str, output: Path | None, ingest: bool, samples: int, command: str
) -> dict[str, Any]:
    from chatqna.evaluation.service import run_against_service

    dataset = load_dataset(dataset_dir)
    results = await run_against_service(dataset, url, ingest=ingest, samples=samples)
    results["command"] = command
    paths = write_outputs(results, output or DEFAULT_RESULTS / f"{dataset.name}-service")
    print(markdown(results).split("## Every mode")[0])
    for kind, path in paths.items():
        print(f"{kind}: {path}", file=sys.stderr)
    return results
