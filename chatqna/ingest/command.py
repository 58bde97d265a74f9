"""`chatqna ingest`: files into the configured index, with a progress bar; `--rebuild`
builds the embedded index anew beside the old one and swaps it in once every file is in."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tqdm import tqdm

from chatqna.backends.protocols import Embedder, Retriever
from chatqna.ingest.dataprep import IngestFile, collect_files, ingest_files, load_limits
from chatqna.ingest.loaders import SUPPORTED_SUFFIXES
from chatqna.settings import Settings

# Builds the configured embedder and retriever (the composition root's, given by the CLI).
OpenBackends = Callable[[Settings], Awaitable[tuple[Embedder, Retriever]]]


async def run_ingest_command(
    settings: Settings, paths: list[Path], force: bool, rebuild: bool, open_backends: OpenBackends
) -> None:
    """Ingest `paths`; with `rebuild`, into a new index built beside the old one, which
    replaces it only once every file is in (a failure or a kill leaves the old one whole)."""
    skipped: list[Path] = []
    files = collect_files(paths, skipped)
    if skipped:
        print(f"{len(skipped)} file(s) skipped: not a supported type", file=sys.stderr)
    if not files:
        raise ValueError(
            "nothing to ingest: no supported files in the paths given (supported: "
            + ", ".join(SUPPORTED_SUFFIXES)
            + ")"
        )
    if not rebuild:
        await _ingest_into(settings, files, open_backends, force)
        return
    staging = rebuild_settings(settings)
    try:
        await _ingest_into(staging, files, open_backends, shown=settings.index_dir)
    except BaseException:
        shutil.rmtree(staging.chatqna_data_dir, ignore_errors=True)
        raise
    replace_embedded_index(settings, staging.index_dir)
    shutil.rmtree(staging.chatqna_data_dir, ignore_errors=True)
    print("rebuilt: the index holds these files alone")


async def _ingest_into(
    settings: Settings,
    files: list[IngestFile],
    open_backends: OpenBackends,
    force: bool = False,
    shown: Path | None = None,
) -> None:
    """Ingest `files` into `settings`' index; the summary names `shown` as where it is."""
    embedder, retriever = await open_backends(settings)
    bar = tqdm(total=0, unit="chunk", desc="embedding", file=sys.stderr, disable=None)
    started = time.perf_counter()

    def on_plan(total: int) -> None:
        bar.reset(total=total)

    try:
        results = await ingest_files(
            files,
            embedder,
            retriever,
            chunk_size=settings.chunk_size,
            chunk_overlap=settings.chunk_overlap,
            force=force,
            limits=load_limits(settings),
            on_plan=on_plan,
            on_chunks_embedded=bar.update,
        )
    finally:
        bar.close()
        try:
            await retriever.aclose()
        finally:
            await embedder.aclose()
    ingested = [r for r in results if r.status == "ingested"]
    chunks = sum(r.chunks for r in ingested)
    seconds = time.perf_counter() - started
    print(
        f"{len(ingested)} file(s) ingested ({chunks} chunks in {seconds:.1f} s, "
        f"{chunks / max(seconds, 1e-9):.1f} chunks/s), "
        f"{len(results) - len(ingested)} unchanged; index in {shown or settings.index_dir}"
    )


def rebuild_settings(settings: Settings) -> Settings:
    """The settings `chatqna ingest --rebuild` builds the new embedded index with: a data
    directory of its own inside the real one (emptied first: an interrupted rebuild leaves
    one behind), whose index later replaces the old one."""
    staging = settings.chatqna_data_dir / ".rebuild"
    if staging.exists():
        shutil.rmtree(staging)
    return settings.model_copy(update={"chatqna_data_dir": staging})


def replace_embedded_index(settings: Settings, rebuilt: Path) -> None:
    """Put the index built in `rebuilt` in the old one's place, then delete the old one. The
    old index is renamed aside first; if the new one cannot take its place, it is put back,
    and an earlier swap cut off between the two renames (the old index aside, none in place)
    is undone before this one starts."""
    target = settings.index_dir
    retired = target.with_name(target.name + ".old")
    if retired.exists():
        if target.exists():
            shutil.rmtree(retired)
        else:
            retired.rename(target)
    if target.exists():
        target.rename(retired)
    try:
        rebuilt.rename(target)
    except BaseException:
        if retired.exists() and not target.exists():
            retired.rename(target)
        raise
    if retired.exists():
        shutil.rmtree(retired)
