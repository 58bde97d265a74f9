"""`chatqna bench`: build the real backends, run the benchmark, write the outputs."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatqna.backends.protocols import ChatLLM, Embedder, GenerationParams, Reranker
from chatqna.composition import (
    build_condense_llm,
    build_embedder,
    build_llm,
    build_reranker,
)
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache
from chatqna.evaluation.compare import condense_strategy, shipped_references
from chatqna.evaluation.dataset import Dataset, load_dataset
from chatqna.evaluation.live import llm_answerer
from chatqna.evaluation.options import with_service_defaults
from chatqna.evaluation.progress import stderr_progress, turn_logs_at_debug
from chatqna.evaluation.provenance import (
    DirtyWorkTree,
    changed_during_run,
    machine,
    measured_commit,
    recorded_command,
    utc_now,
)
from chatqna.evaluation.report import markdown, write_outputs
from chatqna.evaluation.runner import run_benchmark
from chatqna.evaluation.strategies import QueryStrategy, default_strategies
from chatqna.multiturn.strategy import MultiTurnConfig
from chatqna.pipeline.turn import TurnOptions
from chatqna.settings import Settings, dirty_results_allowed

DEFAULT_RESULTS = Path("benchmarks/results")
HISTORIES = ("reference", "own", "both")
PASSAGE_CONTEXTS = ("title", "none")
ORDERS = ("chronological", "newest_first")
ROLES = ("user_assistant", "user", "separate")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _floats(
    options: dict[str, Any], name: str, low: float, high: float = math.inf
) -> tuple[float, ...]:
    """The option's comma-separated numbers, each finite and within [low, high]."""
    text = options[name]
    try:
        values = tuple(float(value) for value in text.split(","))
    except ValueError:
        raise ValueError(
            f"{_flag(name)}: {text!r} is not a comma-separated list of numbers"
        ) from None
    span = f"between {low:g} and {high:g}" if high < math.inf else f"at least {low:g}"
    for value in values:
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{_flag(name)}: {value:g} is out of range (each is {span})")
    return values


def _ints(options: dict[str, Any], name: str, low: int) -> tuple[int, ...]:
    """The option's comma-separated whole numbers, each at least `low`."""
    text = options[name]
    try:
        values = tuple(int(value) for value in text.split(","))
    except ValueError:
        raise ValueError(
            f"{_flag(name)}: {text!r} is not a comma-separated list of whole numbers"
        ) from None
    for value in values:
        if value < low:
            raise ValueError(f"{_flag(name)}: {value} is out of range (each is at least {low})")
    return values


def _choices(
    text: str, name: str, allowed: tuple[str, ...], both: tuple[str, ...]
) -> tuple[str, ...]:
    values = both if text == "both" else tuple(text.split(","))
    for value in values:
        if value not in allowed:
            raise ValueError(f"{_flag(name)}: {value!r} is not one of {', '.join(allowed)} or both")
    return values


@dataclass(frozen=True)
class BenchGrid:
    """What one `chatqna bench` run varies: the blend grid, the retrieval switches, the
    history kinds and the passage context, with the run's sampling and cache, and where it
    is measured (the commit the run starts at, `+dirty` by the operator's opt-in). Built by
    `from_options`, where a grid option not given is the service's setting."""

    alphas: tuple[float, ...]
    history_turns: tuple[int, ...]
    with_llm: bool
    samples: int
    cache_dir: Path | None
    orders: tuple[str, ...]
    bm25_weights: tuple[float, ...]
    bm25_history_weights: tuple[float, ...]
    roles: tuple[str, ...]
    candidates: tuple[int, ...]
    histories: tuple[str, ...]
    passage_context: str
    assistant_weights: tuple[float, ...]
    self_contained: tuple[float, ...]
    command: str = field(default="", compare=False)
    measured_at_commit: str | None = field(default=None, compare=False)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> BenchGrid:
        """The grid from the command's comma-separated options (named as the CLI's
        parameters). A value that is unknown, not a number or out of range is a ValueError
        naming the option, raised before any model is built."""
        history, context = options["history"], options["passage_context"]
        if history not in HISTORIES or context not in PASSAGE_CONTEXTS:
            raise ValueError("--history is reference, own or both; --passage-context title or none")
        if options["samples"] < 1:
            raise ValueError(f"--samples: {options['samples']} is out of range (at least 1)")
        return cls(
            alphas=_floats(options, "alphas", 0.0, 1.0),
            history_turns=_ints(options, "history_turns", 0),
            with_llm=options["llm"],
            samples=options["samples"],
            cache_dir=options["cache_dir"],
            orders=_choices(options["history_order"], "history_order", ORDERS, ORDERS),
            bm25_weights=_floats(options, "bm25_weights", 0.0),
            bm25_history_weights=_floats(options, "bm25_history_weights", 0.0, 1.0),
            roles=_choices(options["history_roles"], "history_roles", ROLES, ROLES[:2]),
            candidates=_ints(options, "fusion_candidates", 1),
            histories=("reference", "own") if history == "both" else (history,),
            passage_context=context,
            assistant_weights=_floats(options, "assistant_weights", 0.0, 1.0),
            self_contained=_floats(options, "self_contained_similarities", 0.0, 1.0),
            command=options.get("command", ""),
        )

    def swept(self) -> dict[str, str]:
        """The blend grid and retrieval switches the run swept, by option, as they would be
        typed: the command a run records shows only the options given, the others being
        the service's settings."""

        def joined(values: tuple[object, ...]) -> str:
            return ",".join(str(value) for value in values)

        return {
            "alphas": joined(self.alphas),
            "history_turns": joined(self.history_turns),
            "history_order": joined(self.orders),
            "history_roles": joined(self.roles),
            "assistant_weights": joined(self.assistant_weights),
            "bm25_weights": joined(self.bm25_weights),
            "bm25_history_weights": joined(self.bm25_history_weights),
            "self_contained_similarities": joined(self.self_contained),
            "fusion_candidates": joined(self.candidates),
        }


def load_datasets(directories: list[Path]) -> list[Dataset]:
    """Every dataset of the run, read before any model is built; a missing or unreadable
    file or a bad line is a ValueError naming it."""
    datasets = []
    for directory in directories:
        try:
            datasets.append(load_dataset(directory))
        except OSError as exc:  # a missing file, or one that cannot be read
            raise ValueError(f"--dataset {directory}: {exc}") from exc
    return datasets


def checked_inputs(options: dict[str, Any], settings: Settings) -> tuple[BenchGrid, list[Dataset]]:
    """The grid and the datasets of a run, every option and file checked, and the work tree
    too: a work tree with uncommitted changes is refused before the run, unless
    `CHATQNA_BENCH_ALLOW_DIRTY=1`; a ValueError names what is wrong. A grid option not
    given (None) is the service's setting in `settings`. The grid's command is the typed
    one after the settings it runs with (which reproduce those defaults), its commit the
    one the run measures."""
    if not options["dataset"]:
        raise ValueError(
            "--dataset is required: a directory with corpus.jsonl and conversations.jsonl"
        )
    typed = {
        **with_service_defaults(options, settings),
        "command": recorded_command(options["command"]),
    }
    grid, datasets = BenchGrid.from_options(typed), load_datasets(options["dataset"])
    try:
        commit = measured_commit(Path.cwd(), allow_dirty=dirty_results_allowed())
    except DirtyWorkTree as exc:
        raise ValueError(str(exc)) from exc
    return dataclasses.replace(grid, measured_at_commit=commit), datasets


def run_provenance(measured_at_commit: str | None) -> dict[str, Any]:
    """Where a run was measured: the commit it started at (None outside a git checkout), the
    machine's cores and load averages, Python, and the date. A work tree that changed
    during the run is warned of on stderr; the result keeps the commit it started at."""
    warning = changed_during_run(Path.cwd(), measured_at_commit)
    if warning is not None:
        print(warning, file=sys.stderr)
    return {"measured_at_commit": measured_at_commit, "machine": machine(), "date": utc_now()}


def settings_snapshot(settings: Settings) -> dict[str, Any]:
    snapshot: dict[str, Any] = settings.model_dump(mode="json")
    return snapshot


def served_answer_options(settings: Settings) -> TurnOptions:
    """What the service answers a turn with by default: `RETRIEVER_K` passages retrieved,
    `RERANK_TOP_N` kept, at most `LLM_MAX_TOKENS` tokens (at temperature 0, so that a
    replay repeats)."""
    params = GenerationParams(max_tokens=settings.llm_max_tokens, temperature=0.0)
    return TurnOptions.from_settings(settings, params=params)


@dataclass
class BenchBackends:
    """The models a run uses, built as the service builds them from `Settings`."""

    raw: Embedder
    embedder: CachingEmbedder
    cache: EmbeddingCache
    answer_llm: ChatLLM | None
    llm: ChatLLM | None
    reranker: Reranker | None


@asynccontextmanager
async def bench_backends(settings: Settings, grid: BenchGrid) -> AsyncIterator[BenchBackends]:
    """The embedder (cached on disk), the LLMs when the grid condenses, and the reranker the
    service would run with these settings (the embedded default has none and keeps the
    fused order); all closed, and the cache saved, on exit."""
    async with AsyncExitStack() as stack:
        raw = await build_embedder(settings)
        stack.push_async_callback(raw.aclose)
        cache_dir = grid.cache_dir
        if cache_dir is None:
            cache_dir = settings.chatqna_data_dir / "bench-cache"
        cache = EmbeddingCache(cache_dir, raw.name)
        stack.callback(cache.save)
        answer_llm = await build_llm(settings) if grid.with_llm else None
        llm = build_condense_llm(settings, answer_llm) if answer_llm is not None else None
        if answer_llm is not None:
            stack.push_async_callback(answer_llm.aclose)
        if llm is not None and llm is not answer_llm:
            stack.push_async_callback(llm.aclose)
        embedder = CachingEmbedder(raw, cache)
        reranker = build_reranker(settings, embedder)
        if reranker is not None:
            stack.push_async_callback(reranker.aclose)
        yield BenchBackends(raw, embedder, cache, answer_llm, llm, reranker)


def _write(results: dict[str, Any], output: Path, measured_at_commit: str | None) -> None:
    results.update(run_provenance(measured_at_commit))
    paths = write_outputs(results, output)
    print(markdown(results).split("## Every mode")[0])
    for kind, path in paths.items():
        print(f"{kind}: {path}", file=sys.stderr)


def grid_strategies(settings: Settings, grid: BenchGrid) -> list[QueryStrategy]:
    """The strategies of a run: every blend of the grid, reranking against the query the
    service would (`MULTI_TURN_RERANK_QUERY`), beside stateless, append, the gold rewrite
    and, with an LLM, condense as the service serves it."""
    return default_strategies(
        MultiTurnConfig.from_settings(settings),
        alphas=grid.alphas,
        history_turns=grid.history_turns,
        condense=condense_strategy(settings) if grid.with_llm else None,
        orders=grid.orders,
        bm25_history_weights=grid.bm25_history_weights,
        roles=grid.roles,
        assistant_weights=grid.assistant_weights,
        self_contained=grid.self_contained,
    )


async def run_bench_command(
    settings: Settings, dataset: Dataset, output: Path | None, grid: BenchGrid
) -> dict[str, Any]:
    started = time.perf_counter()
    async with bench_backends(settings, grid) as models:
        # With an LLM, own history holds its real answers; without, the top passage.
        answer = None
        if models.answer_llm is not None:
            answer = llm_answerer(models.answer_llm, served_answer_options(settings))
        strategies = grid_strategies(settings, grid)
        with turn_logs_at_debug():
            results = await run_benchmark(
                dataset,
                strategies,
                models.embedder,
                models.raw,
                models.llm,
                samples=grid.samples,
                progress=stderr_progress(),
                bm25_weights=grid.bm25_weights,
                candidates=grid.candidates,
                references=shipped_references(settings, depth=10),
                reranker=models.reranker,
                exact_max=settings.chatqna_embedded_exact_max_chunks,
                histories=grid.histories,
                answer=answer,
                passage_context=grid.passage_context,
                dense_weight=settings.rrf_dense_weight,
            )
    results["command"] = grid.command
    results["grid"] = grid.swept()
    results["settings"] = settings_snapshot(settings)
    results["embedder"] = {
        "name": models.raw.name,
        "inputs_computed": models.embedder.inputs_computed,
        "cache": str(models.cache.path),
    }
    results["condense_llm"] = models.llm.model if models.llm is not None else None
    results["seconds_total"] = round(time.perf_counter() - started, 1)
    _write(results, output or DEFAULT_RESULTS / dataset.name, grid.measured_at_commit)
    return results


async def run_service_command(
    dataset: Dataset, url: str, output: Path | None, ingest: bool, grid: BenchGrid
) -> dict[str, Any]:
    from chatqna.evaluation.service import run_against_service

    # A line per request would bury the progress: httpx2's request log is DEBUG here.
    with turn_logs_at_debug(("httpx2",)):
        results = await run_against_service(
            dataset,
            url,
            ingest=ingest,
            samples=grid.samples,
            progress=stderr_progress(),
            histories=grid.histories,
            answers=grid.with_llm,
        )
    results["command"] = grid.command
    target = output or DEFAULT_RESULTS / f"{dataset.name}-service"
    _write(results, target, grid.measured_at_commit)
    return results
