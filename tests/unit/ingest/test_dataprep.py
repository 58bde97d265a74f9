"""Ingestion: collecting files, skipping unchanged ones, and all-or-nothing index updates."""

from __future__ import annotations

import asyncio
import math
import os
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import SearchQuery
from chatqna.errors import DocumentLoadError, InvalidRequest, PayloadTooLarge, UnsupportedFileType
from chatqna.ingest import chunking
from chatqna.ingest.dataprep import (
    IngestFile,
    IngestResult,
    RequestLimits,
    collect_files,
    ingest_files,
    request_limits,
)
from chatqna.ingest.dataprep import content_hash as file_hash
from chatqna.ingest.loaders import LoadedDocument
from chatqna.retrieval.embedded.chunk_store import STORE_FILE
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.settings import Settings

pytestmark = pytest.mark.anyio

DIM = 128

GUIDE = (
    b"# Guide\n\n## Refunds\n\nRefunds reach the original card within fourteen days.\n\n"
    b"## Shipping\n\nCouriers deliver parcels in three working days.\n\n"
    b"## Passwords\n\nReset a forgotten password from the login page.\n"
)  # three sections -> three chunks
NOTES = b"Office hours are nine to five on weekdays."  # one chunk
FAQ = b"# FAQ\n\n## Warranty\n\nHardware warranty lasts two years.\n"  # one chunk


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder(DIM, max_batch=2)


@pytest.fixture
async def store(tmp_path: Path) -> EmbeddedHybridIndex:
    return await EmbeddedHybridIndex.open(
        tmp_path / "index", embedder_name=f"hashing-{DIM}", dimension=DIM
    )


def corpus() -> list[IngestFile]:
    return [IngestFile("guide.md", GUIDE), IngestFile("notes.txt", NOTES)]


async def snapshot(store: EmbeddedHybridIndex) -> tuple[object, ...]:
    """Everything observable about the index: sources, stored texts, the file on disk."""
    vector = np.ones(DIM, np.float32) / math.sqrt(DIM)
    hits = await store.search(SearchQuery("refunds couriers office", vector, 100, False))
    on_disk = store.path.read_bytes() if store.path.exists() else None
    return (await store.list_sources(), sorted(h.chunk.text for h in hits), on_disk)


def embedded(embedder: HashingEmbedder) -> list[str]:
    return [text for batch in embedder.batches for text in batch]


# --- collect_files ----------------------------------------------------------------------------


def test_collect_files_from_a_tree(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.md").write_bytes(b"alpha")
    (root / "sub" / "b.txt").write_bytes(b"beta")
    (root / "sub" / "deeper" / "c.HTML").write_bytes(b"<p>gamma</p>")
    (root / "tool.exe").write_bytes(b"MZ")
    (root / "sub" / "report.doc").write_bytes(b"PK")
    (root / "README").write_bytes(b"no suffix")
    skipped: list[Path] = []
    files = collect_files([root], skipped)
    assert [(f.source, f.data) for f in files] == [
        ("a.md", b"alpha"),
        ("sub/b.txt", b"beta"),
        ("sub/deeper/c.HTML", b"<p>gamma</p>"),
    ]
    assert sorted(p.relative_to(root).as_posix() for p in skipped) == [
        "README",
        "sub/report.doc",
        "tool.exe",
    ]


def test_collect_single_file_uses_its_name(tmp_path: Path) -> None:
    (tmp_path / "nested").mkdir()
    path = tmp_path / "nested" / "policy.md"
    path.write_bytes(b"# Policy")
    assert collect_files([path]) == [IngestFile("policy.md", b"# Policy")]


def test_collect_missing_path_raises(tmp_path: Path) -> None:
    (tmp_path / "real.md").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="missing"):
        collect_files([tmp_path / "real.md", tmp_path / "missing"])


# --- ingest_files -----------------------------------------------------------------------------


async def test_ingest_markdown_and_text(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    results = await ingest_files(corpus(), embedder, store)
    assert results == [
        IngestResult("guide.md", "ingested", 3),
        IngestResult("notes.txt", "ingested", 1),
    ]
    listed = {s.source: (s.chunks, s.content_hash) for s in await store.list_sources()}
    assert listed == {
        "guide.md": (3, file_hash(GUIDE, 1200, 150)),
        "notes.txt": (1, file_hash(NOTES, 1200, 150)),
    }
    query = "how long do refunds take"
    hits = await store.search(SearchQuery(query, (await embedder.embed([query]))[0], 1))
    assert hits[0].chunk.source == "guide.md"
    assert hits[0].chunk.title == "Refunds"


async def test_unchanged_files_are_skipped_without_embedding(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    await ingest_files(corpus(), embedder, store)
    calls = len(embedder.batches)
    before = await snapshot(store)
    plans: list[int] = []
    results = await ingest_files(corpus(), embedder, store, on_plan=plans.append)
    assert [r.status for r in results] == ["unchanged", "unchanged"]
    assert [r.chunks for r in results] == [0, 0]
    assert len(embedder.batches) == calls
    assert plans == [0]
    assert await snapshot(store) == before


async def test_changed_content_is_reingested_and_replaced(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    await ingest_files(corpus(), embedder, store)
    embedder.batches.clear()
    new_guide = b"# Guide\n\n## Refunds\n\nRefunds now take thirty days.\n"
    results = await ingest_files(
        [IngestFile("guide.md", new_guide), IngestFile("notes.txt", NOTES)], embedder, store
    )
    assert results == [
        IngestResult("guide.md", "ingested", 1),
        IngestResult("notes.txt", "unchanged", 0),
    ]
    assert embedded(embedder) == ["Refunds\nRefunds now take thirty days."]
    sources, stored, _ = await snapshot(store)
    assert stored == sorted(["Refunds now take thirty days.", NOTES.decode()])
    assert {s.source: s.chunks for s in sources} == {"guide.md": 1, "notes.txt": 1}
    assert store.content_hash("guide.md") == file_hash(new_guide, 1200, 150)


async def test_each_chunk_is_indexed_with_its_title_line_and_shown_without(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    await ingest_files(corpus(), embedder, store)
    assert embedded(embedder) == [
        "Refunds\nRefunds reach the original card within fourteen days.",
        "Shipping\nCouriers deliver parcels in three working days.",
        "Passwords\nReset a forgotten password from the login page.",
        "notes\n" + NOTES.decode(),  # a plain text file is titled by its name
    ]
    # "shipping" is only in the heading: BM25 finds the chunk by its title line.
    vector = np.ones(DIM, np.float32) / math.sqrt(DIM)
    hits = await store.search(SearchQuery("shipping", vector, 1, fusion_weights=(0.0, 1.0)))
    assert hits[0].chunk.title == "Shipping"
    assert hits[0].chunk.text == "Couriers deliver parcels in three working days."


async def test_files_indexed_by_an_earlier_version_are_reingested(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("chatqna.ingest.dataprep.INDEXED_TEXT_VERSION", "earlier")
    await ingest_files(corpus(), embedder, store)
    monkeypatch.undo()
    results = await ingest_files(corpus(), embedder, store)
    assert [r.status for r in results] == ["ingested", "ingested"]
    assert store.content_hash("guide.md") == file_hash(GUIDE, 1200, 150)


async def test_changed_chunking_parameters_reingest(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    await ingest_files(corpus(), embedder, store)
    embedder.batches.clear()
    results = await ingest_files(corpus(), embedder, store, chunk_size=1000, chunk_overlap=100)
    assert [r.status for r in results] == ["ingested", "ingested"]
    assert len(embedded(embedder)) == 4


async def test_force_reembeds_everything(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    await ingest_files(corpus(), embedder, store)
    first = embedded(embedder)
    embedder.batches.clear()
    results = await ingest_files(corpus(), embedder, store, force=True)
    assert [(r.status, r.chunks) for r in results] == [("ingested", 3), ("ingested", 1)]
    assert embedded(embedder) == first
    assert sum(s.chunks for s in await store.list_sources()) == 4  # replaced, not duplicated


async def test_unsupported_file_fails_before_any_embedding(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    await ingest_files([IngestFile("faq.md", FAQ)], embedder, store)
    embedder.batches.clear()
    before = await snapshot(store)
    with pytest.raises(UnsupportedFileType, match=r"x\.exe"):
        await ingest_files([*corpus(), IngestFile("x.exe", b"MZ\x90\x00")], embedder, store)
    assert embedder.batches == []
    assert await snapshot(store) == before


@pytest.mark.parametrize(
    "name",
    [
        "nul\x00.md",
        "tab\tname.md",
        "sub/\x7fdel.md",
        "a\u2066b.md",
        "a\u2028INFO forged.md",  # line separator
        "b\u2029c.md",  # paragraph separator
        "invoice\u200fdm.exe.md",  # right-to-left mark
        "zero\u200bwidth.md",
        "bom\ufeff.md",
    ],
)
async def test_control_characters_in_a_name_fail_before_any_embedding(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder, name: str
) -> None:
    before = await snapshot(store)
    with pytest.raises(InvalidRequest, match="control characters") as info:
        await ingest_files([*corpus(), IngestFile(name, b"# T\n\ntext")], embedder, store)
    assert info.value.reason == "bad_file_name" and info.value.status_code == 400
    assert embedder.batches == []
    assert await snapshot(store) == before


async def test_joiners_that_words_and_emoji_are_written_with_are_kept_in_a_name(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.md"  # a ZWNJ
    emoji = "\U0001f469\u200d\U0001f4bb.md"  # a ZWJ sequence
    files = [IngestFile(name, b"# T\n\ntext") for name in (persian, emoji)]
    results = await ingest_files(files, embedder, store)
    assert [r.source for r in results] == [persian, emoji]


@pytest.mark.skipif(os.name != "posix", reason="names are bytes only on POSIX file systems")
async def test_a_name_that_is_not_utf8_is_refused_showing_its_bytes(
    tmp_path: Path, store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    (tmp_path / "sub").mkdir()
    with open(os.path.join(os.fsencode(tmp_path), b"sub", b"caf\xe9.md"), "wb") as file:
        file.write(b"# Caf\xc3\xa9\n\ntext")
    files = collect_files([tmp_path])
    before = await snapshot(store)
    with pytest.raises(InvalidRequest) as info:
        await ingest_files([*corpus(), *files], embedder, store)
    assert str(info.value) == "file name b'sub/caf\\xe9.md' is not valid UTF-8; rename the file"
    assert info.value.reason == "bad_file_name" and info.value.status_code == 400
    assert embedder.batches == []
    assert await snapshot(store) == before


async def test_a_lone_surrogate_in_a_name_is_refused_in_ascii(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    with pytest.raises(InvalidRequest, match=re.escape("file name 'a\\ud800.md' is not valid")):
        await ingest_files([IngestFile("a\ud800.md", b"text")], embedder, store)


async def test_names_in_any_script_are_accepted(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    # Zero-width non-joiner (U+200C) is part of ordinary Persian spelling, not a control.
    names = [
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.md",
        "r\u00e9sum\u00e9.txt",
        "\u8bf4\u660e.md",
    ]
    files = [IngestFile(name, b"# T\n\nsome text") for name in names]
    results = await ingest_files(files, embedder, store)
    assert [r.status for r in results] == ["ingested"] * 3


@pytest.mark.parametrize(
    "bad",
    [IngestFile("broken.txt", b"caf\xe9 \xff\xfe"), IngestFile("empty.md", b"")],
    ids=["invalid-utf8", "empty-md"],
)
async def test_unreadable_file_fails_whole_batch(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder, bad: IngestFile
) -> None:
    await ingest_files([IngestFile("faq.md", FAQ)], embedder, store)
    embedder.batches.clear()
    before = await snapshot(store)
    changed_faq = IngestFile("faq.md", FAQ + b"\nAlso covers batteries.\n")
    with pytest.raises(DocumentLoadError, match=re.escape(bad.source)):
        await ingest_files([*corpus(), bad, changed_faq], embedder, store)
    assert embedder.batches == []
    assert await snapshot(store) == before


class FailingEmbedder(HashingEmbedder):
    """Raises on its `fail_on`-th call (1-based)."""

    def __init__(self, fail_on: int) -> None:
        super().__init__(DIM, max_batch=2)
        self.fail_on = fail_on

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if len(self.batches) + 1 == self.fail_on:
            self.batches.append(list(texts))
            raise RuntimeError("embedder went away")
        return await super().embed(texts)


async def test_embedder_failure_midway_leaves_index_unchanged(
    store: EmbeddedHybridIndex, embedder: HashingEmbedder
) -> None:
    await ingest_files([IngestFile("faq.md", FAQ)], embedder, store)
    before = await snapshot(store)
    failing = FailingEmbedder(fail_on=2)
    with pytest.raises(RuntimeError, match="went away"):
        await ingest_files([*corpus(), IngestFile("faq.md", b"Changed.")], failing, store)
    assert len(failing.batches) == 2  # the first batch succeeded, the second raised
    assert await snapshot(store) == before


@pytest.mark.parametrize("max_batch", [1, 2, 3, 64])
async def test_progress_and_batching(store: EmbeddedHybridIndex, max_batch: int) -> None:
    embedder = HashingEmbedder(DIM, max_batch=max_batch)
    plans: list[int] = []
    progress: list[int] = []
    files = [*corpus(), IngestFile("faq.md", FAQ)]
    results = await ingest_files(
        files, embedder, store, on_plan=plans.append, on_chunks_embedded=progress.append
    )
    total = sum(r.chunks for r in results)
    assert total == 5
    assert plans == [total]
    assert sum(progress) == total
    assert progress == [len(b) for b in embedder.batches]
    assert all(0 < len(b) <= max_batch for b in embedder.batches)
    assert len(embedder.batches) == math.ceil(total / max_batch)
    assert (await store.describe())["chunks"] == total
    assert store.path.name == STORE_FILE and store.path.exists()


async def test_loading_and_chunking_run_off_the_event_loop(
    embedder: HashingEmbedder, store: EmbeddedHybridIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow parse (a large PDF) must not stall other requests: while the loader blocks,
    another coroutine on the loop still runs, and it is what lets the loader finish."""
    from chatqna.ingest import dataprep

    release = threading.Event()
    loader_threads: list[threading.Thread] = []
    real_load = dataprep.load_document

    def blocking_load(source: str, data: bytes, **options: Any) -> LoadedDocument:
        loader_threads.append(threading.current_thread())
        # On the loop, the coroutine that sets the event could never run: give up after a
        # while rather than hang the suite, and fail below.
        assert release.wait(timeout=5), "the loader blocked the event loop"
        return real_load(source, data, **options)

    monkeypatch.setattr(dataprep, "load_document", blocking_load)

    async def other_request() -> None:
        await asyncio.sleep(0)
        release.set()

    results, _ = await asyncio.gather(ingest_files(corpus(), embedder, store), other_request())
    assert [r.status for r in results] == ["ingested", "ingested"]
    assert loader_threads and threading.main_thread() not in loader_threads


async def test_each_batch_s_texts_are_built_when_it_is_sent(
    store: EmbeddedHybridIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk's indexed text (title line and text) exists only while its batch is embedded,
    never for every chunk of the request at once."""
    from chatqna import documents

    built: list[int] = []
    real = documents.indexed_text

    def counting(title: str, text: str) -> str:
        built.append(1)
        return real(title, text)

    seen: list[int] = []

    class Recording(HashingEmbedder):
        async def embed(self, texts: Sequence[str]) -> np.ndarray:
            seen.append(len(built))
            return await super().embed(texts)

    monkeypatch.setattr(documents, "indexed_text", counting)
    embedder = Recording(DIM, max_batch=2)
    await ingest_files([*corpus(), IngestFile("faq.md", FAQ)], embedder, store)
    # Five chunks in batches of 2, 2, 1: each batch built just before it was sent.
    assert seen == [2, 4, 5]


# --- what one request may expand to ---------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "refused"),
    [
        (RequestLimits(max_text_chars=len(GUIDE) + 10, max_chunks=100), "characters of text"),
        (RequestLimits(max_text_chars=10_000, max_chunks=3), "chunks"),
    ],
)
async def test_a_request_beyond_its_budget_is_refused_before_anything_is_embedded(
    embedder: HashingEmbedder, store: EmbeddedHybridIndex, limits: RequestLimits, refused: str
) -> None:
    await ingest_files([IngestFile("faq.md", FAQ)], embedder, store)
    before, batches = await snapshot(store), len(embedder.batches)
    with pytest.raises(PayloadTooLarge, match=refused) as raised:
        await ingest_files(corpus(), embedder, store, per_request=limits)
    assert raised.value.status_code == 413
    assert raised.value.reason == "request_too_large"
    assert raised.value.details["source"] == "notes.txt"  # the file that passed the bound
    assert len(embedder.batches) == batches
    assert await snapshot(store) == before


async def test_a_file_cut_into_too_many_chunks_stops_being_cut_at_the_bound(
    embedder: HashingEmbedder, store: EmbeddedHybridIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ingest_files([IngestFile("faq.md", FAQ)], embedder, store)
    before, batches = await snapshot(store), len(embedder.batches)
    drawn = 0
    split = chunking._split

    def counting(text: str, max_chars: int, overlap_chars: int) -> Iterator[str]:
        nonlocal drawn
        for piece in split(text, max_chars, overlap_chars):
            drawn += 1
            yield piece

    monkeypatch.setattr(chunking, "_split", counting)
    # A stride of one character over 200,000: unbounded, some 200,000 chunks.
    big = IngestFile("big.txt", b"x" * 200_000)
    limits = RequestLimits(max_text_chars=1_000_000, max_chunks=50)
    with pytest.raises(PayloadTooLarge, match="chunks") as raised:
        await ingest_files(
            [IngestFile("notes.txt", NOTES), big],
            embedder,
            store,
            chunk_size=100,
            chunk_overlap=99,
            per_request=limits,
        )
    assert raised.value.status_code == 413
    assert raised.value.reason == "request_too_large"
    assert raised.value.details == {"source": "big.txt", "count": 51, "limit": 50}
    assert drawn == 50  # notes.txt is one chunk; big.txt's 50th piece passed the bound
    assert len(embedder.batches) == batches
    assert await snapshot(store) == before


async def test_without_a_request_budget_a_file_is_cut_whole(
    embedder: HashingEmbedder, store: EmbeddedHybridIndex
) -> None:
    # The CLI gives no per-request budget: nothing bounds the cutting.
    big = IngestFile("big.txt", b"x" * 700)
    [result] = await ingest_files([big], embedder, store, chunk_size=100, chunk_overlap=99)
    assert (result.status, result.chunks) == ("ingested", 601)


async def test_the_budget_counts_only_the_files_to_embed(
    embedder: HashingEmbedder, store: EmbeddedHybridIndex
) -> None:
    await ingest_files(corpus(), embedder, store)
    limits = RequestLimits(max_text_chars=200, max_chunks=1)  # FAQ alone fits
    results = await ingest_files(
        [*corpus(), IngestFile("faq.md", FAQ)], embedder, store, per_request=limits
    )
    assert [r.status for r in results] == ["unchanged", "unchanged", "ingested"]


def test_request_limits_come_from_the_settings() -> None:
    settings = Settings(
        chatqna_dataprep_max_request_text_chars=123, chatqna_dataprep_max_request_chunks=45
    )
    assert request_limits(settings) == RequestLimits(max_text_chars=123, max_chunks=45)
