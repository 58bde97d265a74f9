"""The `chatqna` command: `serve`, `retriever`, `ingest`, `ask`, `bench`.

`serve` runs the chat service, `retriever` the retriever service, `ingest` indexes files,
`ask` streams an answer from a running service, and `bench` scores retrieval on a dataset.

Settings come from the environment (see `.env.example`); options given here override the
matching variable for this run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

from chatqna.evaluation.options import (
    SERVED_FUSION_CANDIDATES,
    Alphas,
    AssistantWeights,
    Bm25HistoryWeights,
    Bm25Weights,
    CacheDir,
    Datasets,
    EmbeddedReranker,
    FusionCandidates,
    History,
    HistoryOrder,
    HistoryRoles,
    HistoryTurns,
    Ingest,
    OutputDir,
    PassageContext,
    Render,
    RerankerEndpoint,
    Samples,
    SelfContained,
    ServiceUrl,
    WithLlm,
)
from chatqna.logging_setup import configure_logging
from chatqna.settings import ClientSettings, Settings, describe_validation_error
from chatqna.workers import usable_cores, worker_environment

if TYPE_CHECKING:
    from chatqna.evaluation.command import BenchGrid
    from chatqna.evaluation.dataset import Dataset

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode="markdown"
)


SettingsT = TypeVar("SettingsT", Settings, ClientSettings)


async def open_backends(settings: Settings) -> tuple[Any, Any]:
    """The configured embedder and retriever, for `chatqna ingest`."""
    from chatqna.composition import build_retrieval_backends

    backends = await build_retrieval_backends(settings)
    return backends.embedder, backends.retriever


def load_settings(model: type[SettingsT], **overrides: Any) -> SettingsT:
    """`model` from the environment plus CLI overrides; exits with a clear message if bad.
    A client command loads `ClientSettings`, so no server-side setting can stop it."""
    try:
        return model(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        typer.echo(describe_validation_error(exc), err=True)
        raise typer.Exit(2) from exc


def server_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn options both servers share; the compiled loop and parser where installed."""
    root_path = settings.chatqna_root_path
    options: dict[str, Any] = {
        "log_level": settings.chatqna_log_level.lower(),
        "root_path": "" if root_path is None else root_path,
        "timeout_graceful_shutdown": 5,
    }
    if importlib.util.find_spec("uvloop") is not None:
        options["loop"] = "uvloop"
    if importlib.util.find_spec("httptools") is not None:
        options["http"] = "httptools"
    return options


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (CHATQNA_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (MEGA_SERVICE_PORT)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Index location (CHATQNA_DATA_DIR)")] = None,
    workers: Annotated[
        str | None, typer.Option(help="Server processes on the one port, or auto (CHATQNA_WORKERS)")
    ] = None,
) -> None:
    """Serve the API in the foreground."""
    import uvicorn

    overrides = {
        "chatqna_host": host,
        "mega_service_port": port,
        "chatqna_data_dir": data_dir,
        "chatqna_workers": workers,
    }
    settings = load_settings(Settings, **overrides)
    configure_logging(settings)
    count = settings.worker_count(usable_cores())
    common: dict[str, Any] = {
        "host": settings.chatqna_host,
        "port": settings.mega_service_port,
        **server_options(settings),
    }
    if count == 1:
        from chatqna.app import create_app

        uvicorn.run(create_app(settings), **common)
        return
    # Each worker builds its own app from the environment: the options given here go there.
    os.environ.update(worker_environment(overrides))
    with tempfile.TemporaryDirectory(prefix="chatqna-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # one scrape sums every worker
        typer.echo(f"serving with {count} worker processes", err=True)
        from chatqna.app import serve_workers

        if not serve_workers(count, common):
            typer.echo("a worker failed to start (see its error above)", err=True)
            raise typer.Exit(3)


@app.command()
def retriever(
    host: Annotated[str | None, typer.Option(help="Bind address (CHATQNA_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (RETRIEVER_SERVICE_PORT)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Index location (CHATQNA_DATA_DIR)")] = None,
) -> None:
    """Serve the retriever service (OPEA's /v1/retrieval, plus dataprep) in the foreground."""
    import uvicorn

    from chatqna.app import create_app

    settings = load_settings(
        Settings, chatqna_host=host, retriever_service_port=port, chatqna_data_dir=data_dir
    )
    configure_logging(settings)
    uvicorn.run(
        create_app(settings, role="retriever"),
        host=settings.chatqna_host,
        port=settings.retriever_service_port,
        **server_options(settings),
    )


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files or directories to ingest")],
    data_dir: Annotated[Path | None, typer.Option(help="Index location (CHATQNA_DATA_DIR)")] = None,
    force: Annotated[bool, typer.Option(help="Re-embed files even if unchanged")] = False,
    rebuild: Annotated[
        bool,
        typer.Option(
            help="Build the embedded index anew from these paths alone; it replaces the old "
            "one only once every file is in"
        ),
    ] = False,
) -> None:
    """Ingest txt, md, html, pdf, docx, pptx, xlsx, csv, json and jsonl files into the index,
    with a progress bar."""
    from chatqna.ingest.command import run_ingest_command

    settings = load_settings(Settings, chatqna_data_dir=data_dir)
    configure_logging(settings)
    if rebuild:
        from chatqna.composition import uses_embedded_index

        if not uses_embedded_index(settings):
            typer.echo("--rebuild applies to the embedded index only", err=True)
            raise typer.Exit(2)
    try:
        asyncio.run(run_ingest_command(settings, paths, force, rebuild, open_backends))
    except Exception as exc:  # report, do not dump a traceback on a user
        typer.echo(f"ingest failed: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command()
def ask(
    question: Annotated[list[str], typer.Argument(help="One message per turn; the last is asked")],
    url: Annotated[
        str, typer.Option(help="Base URL of a running service")
    ] = "http://127.0.0.1:8888",
    api_key: Annotated[
        str | None, typer.Option(help="The service's API key (CHATQNA_API_KEY)")
    ] = None,
) -> None:
    """Ask a running service a question (earlier arguments are earlier user turns).

    Exits 1, with one line on stderr, unless the whole answer arrived."""
    from chatqna.ask import AnswerPrinter, AskFailed, stream_answer

    if not url.startswith(("http://", "https://")):
        typer.echo(f"--url must be an http:// or https:// URL, got {url!r}", err=True)
        raise typer.Exit(2)
    key = load_settings(ClientSettings, chatqna_api_key=api_key).chatqna_api_key
    printer = AnswerPrinter()
    try:
        stream_answer(url, question, printer, None if key is None else key.get_secret_value())
    except AskFailed as exc:
        if printer.wrote_text:
            typer.echo()  # end the partial answer's line
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo()


def bench_inputs(options: dict[str, Any], settings: Settings) -> tuple[BenchGrid, list[Dataset]]:
    """The grid and the datasets of a `bench` run, a grid option not given at the service's
    setting, every option and file (and the work tree) checked before any model is built;
    a bad one exits 2 with one line naming it."""
    from chatqna.evaluation.command import checked_inputs

    try:
        return checked_inputs(options, settings)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc


def render_bench(results: Path) -> None:
    """Redraw the tables and the chart of a `results.json`; exit 2 when it is missing or
    not one of `chatqna bench`."""
    from chatqna.evaluation.report import render_from

    try:
        rendered = render_from(results)
    except (OSError, ValueError) as exc:  # missing, or not a results.json of `chatqna bench`
        typer.echo(f"--render {results}: cannot render it ({exc})", err=True)
        raise typer.Exit(2) from exc
    for kind, path in rendered.items():
        typer.echo(f"{kind}: {path}")


def run_bench(
    settings: Settings,
    datasets: list[Dataset],
    grid: BenchGrid,
    output: Path | None,
    *,
    service: str | None,
    ingest: bool,
) -> None:
    """Each dataset in process, or against the running `service`; with several datasets,
    each one's outputs go to a directory of its name under `output`."""
    from chatqna.evaluation.command import run_bench_command, run_service_command

    for loaded in datasets:
        target = output / loaded.path.name if output is not None and len(datasets) > 1 else output
        if service is not None:
            run = run_service_command(loaded, service, target, ingest, grid)
        else:
            run = run_bench_command(settings, loaded, target, grid)
        asyncio.run(run)


@app.command()
def bench(
    dataset: Datasets = None,
    output: OutputDir = None,
    alphas: Alphas = None,
    history_turns: HistoryTurns = None,
    llm: WithLlm = True,
    samples: Samples = 1000,
    cache_dir: CacheDir = None,
    service: ServiceUrl = None,
    ingest: Ingest = False,
    history_order: HistoryOrder = None,
    bm25_weights: Bm25Weights = None,
    bm25_history_weights: Bm25HistoryWeights = None,
    history_roles: HistoryRoles = None,
    assistant_weights: AssistantWeights = None,
    self_contained_similarities: SelfContained = None,
    history: History = "both",
    passage_context: PassageContext = "title",
    fusion_candidates: FusionCandidates = SERVED_FUSION_CANDIDATES,
    render: Render = None,
    reranker_endpoint: RerankerEndpoint = None,
    embedded_reranker: EmbeddedReranker = None,
) -> None:
    """Per-turn retrieval quality of every multi-turn mode on a dataset (turn 1 vs follow-ups).

    A grid option not given takes the service's setting: a bare run measures what
    `chatqna serve` would run. Progress goes to stderr: bars on a terminal, a line every
    30 s per task elsewhere."""
    if render is not None:
        render_bench(render)
        return
    options: dict[str, Any] = {
        "dataset": dataset,
        "alphas": alphas,
        "history_turns": history_turns,
        "llm": llm,
        "samples": samples,
        "cache_dir": cache_dir,
        "history_order": history_order,
        "bm25_weights": bm25_weights,
        "bm25_history_weights": bm25_history_weights,
        "history_roles": history_roles,
        "assistant_weights": assistant_weights,
        "self_contained_similarities": self_contained_similarities,
        "history": history,
        "passage_context": passage_context,
        "fusion_candidates": fusion_candidates,
        "command": "chatqna bench " + shlex.join(sys.argv[2:]),
    }
    settings = load_settings(
        Settings,
        tei_reranking_endpoint=reranker_endpoint,
        chatqna_embedded_reranker=embedded_reranker,
    )
    grid, datasets = bench_inputs(options, settings)
    configure_logging(settings)
    run_bench(settings, datasets, grid, output, service=service, ingest=ingest)


def main() -> None:
    app()
