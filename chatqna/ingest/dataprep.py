"""Ingestion: files -> text sections -> chunks -> embeddings -> index, all or nothing.

Every file is read and chunked before anything is embedded, so an unsupported or unreadable
file fails the whole request before any work is done; all embeddings are computed before
the index is touched, and the index applies the new sources in one atomic replacement (a
Redis Cluster replaces each source atomically, one after the other). A failure anywhere
leaves the index exactly as it was (on a Redis Cluster, a failure while writing leaves each
source old or new). A file whose content (and chunking
parameters, and what each chunk's legs index) did not change since it was last ingested is
skipped, so re-running the quick start does not embed the corpus again.

Each chunk is embedded, and indexed for BM25 by the retriever, as `Chunk.indexed_text`: its
title line (section heading or document title), then its text.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chatqna.backends.protocols import Embedder, Retriever, SourceBatch
from chatqna.documents import INDEXED_TEXT_VERSION, Chunk
from chatqna.errors import InvalidRequest, PayloadTooLarge, UnsupportedFileType
from chatqna.ingest.chunking import TooManyChunks, chunk_document
from chatqna.ingest.loaders import (
    SUPPORTED_SUFFIXES,
    LoadLimits,
    format_of,
    load_document,
    text_chars,
)
from chatqna.ingest.parse_pool import ParseSlot
from chatqna.settings import Settings

ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class IngestFile:
    """A file to ingest: the name it will be known by (`source`) and its bytes.

    `kind` is the format when the name does not tell it (a fetched link, read by its
    content type), `charset` a fetched page's charset from its HTTP header.
    """

    source: str
    data: bytes
    kind: str | None = None
    charset: str | None = None


def load_limits(settings: Settings) -> LoadLimits:
    """The `CHATQNA_DATAPREP_MAX_*` bounds on what one file may unpack to."""
    return LoadLimits(
        max_unpacked_bytes=settings.chatqna_dataprep_max_unpacked_bytes,
        max_cells=settings.chatqna_dataprep_max_cells,
        max_text_chars=settings.chatqna_dataprep_max_text_chars,
    )


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on what one request's files may expand to together, so many small files that
    each unpack to just under `LoadLimits` cannot add up to gigabytes: the characters of
    text they hold (headings included) and the chunks they are cut into. Counted as each
    file is loaded and chunked (a file's chunking stops as soon as it passes what is left of
    `max_chunks`); passing either refuses the request (413) before anything is embedded or
    written."""

    max_text_chars: int
    max_chunks: int


def request_limits(settings: Settings) -> RequestLimits:
    """The `CHATQNA_DATAPREP_MAX_REQUEST_*` bounds on what one ingest request may expand to."""
    return RequestLimits(
        max_text_chars=settings.chatqna_dataprep_max_request_text_chars,
        max_chunks=settings.chatqna_dataprep_max_request_chunks,
    )


class _Budget:
    """What the files loaded so far hold together, against `RequestLimits`."""

    def __init__(self, limits: RequestLimits | None) -> None:
        self._limits = limits
        self.chars = 0
        self.chunks = 0

    def add_text(self, source: str, chars: int) -> None:
        self.chars += chars
        if self._limits is not None and self.chars > self._limits.max_text_chars:
            raise _too_much(source, "characters of text", self.chars, self._limits.max_text_chars)

    def chunks_left(self) -> int | None:
        """How many more chunks the request may have (`None`: no bound)."""
        return None if self._limits is None else max(self._limits.max_chunks - self.chunks, 0)

    def add_chunks(self, source: str, chunks: int) -> None:
        self.chunks += chunks
        if self._limits is not None and self.chunks > self._limits.max_chunks:
            raise _too_much(source, "chunks", self.chunks, self._limits.max_chunks)


def _too_much(source: str, unit: str, count: int, limit: int) -> PayloadTooLarge:
    variable = "CHUNKS" if unit == "chunks" else "TEXT_CHARS"
    return PayloadTooLarge(
        f"this request's files and pages hold more than {limit} {unit} together ({count} "
        f"with {source}; CHATQNA_DATAPREP_MAX_REQUEST_{variable}); send them in several requests",
        reason="request_too_large",
        details={"source": source, "count": count, "limit": limit},
    )


class RequestBytes:
    """The bytes one request's links have brought in so far; past `limit`
    (`CHATQNA_MAX_UPLOAD_REQUEST_BYTES`), the request is refused with a 413."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.count = 0

    def take(self, url: str, size: int) -> None:
        self.count += size
        if self.count > self._limit:
            raise PayloadTooLarge(
                f"{url}: this request's links bring in more than {self._limit} bytes "
                "together (CHATQNA_MAX_UPLOAD_REQUEST_BYTES); send them in several requests",
                reason="request_too_large",
                details={"url": url, "limit": self._limit},
            )


# Refused in a name: controls (Cc), line and paragraph separators (Zl, Zp: a new line to
# a log reader) and format characters (Cf: bidi overrides and marks that make a name
# display as something it is not, invisible characters), except the zero-width non-joiner
# and joiner, which Persian and Indic words and emoji sequences are written with.
_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cf"})
_JOINERS = frozenset("\u200c\u200d")


def check_source_name(source: str) -> None:
    """Refuse a name with control characters (a NUL, a newline, an escape, a line
    separator, a bidi override or mark, a zero-width space).

    Such a name would be stored, listed and matched for deletion byte for byte, and it
    can forge log lines; no file a person means to upload is called that. A name with
    lone surrogates (a file name that is not UTF-8, as Python decodes it) cannot be stored
    or shown as text; it is refused showing its bytes.
    """
    if any(unicodedata.category(c) == "Cs" for c in source):
        try:
            shown = repr(os.fsencode(source))
        except UnicodeEncodeError:  # a surrogate no file system byte decodes to
            shown = ascii(source)
        raise InvalidRequest(
            f"file name {shown} is not valid UTF-8; rename the file",
            reason="bad_file_name",
            details={"source": shown},
        )
    bad = sorted(
        {
            f"U+{ord(c):04X}"
            for c in source
            if unicodedata.category(c) in _REFUSED_CATEGORIES and c not in _JOINERS
        }
    )
    if bad:
        raise InvalidRequest(
            f"file name {source!r} contains control characters ({', '.join(bad)})",
            reason="bad_file_name",
            details={"source": source, "characters": bad},
        )


@dataclass(frozen=True)
class IngestResult:
    """What happened to one file: `ingested` (with its chunk count) or `unchanged`."""

    source: str
    status: str
    chunks: int


def content_hash(data: bytes, chunk_size: int, chunk_overlap: int) -> str:
    digest = hashlib.sha256(data)
    digest.update(f"|{chunk_size}|{chunk_overlap}|{INDEXED_TEXT_VERSION}".encode())
    return digest.hexdigest()


def collect_files(paths: Sequence[Path], skipped: list[Path] | None = None) -> list[IngestFile]:
    """Expand files and directories into `IngestFile`s; sources are relative to the root.

    A directory contributes its supported files (recursively, in sorted order), named
    relative to that directory; the others are added to `skipped` when it is given. A file
    given directly is named by its file name.
    """
    files: list[IngestFile] = []
    for path in paths:
        if path.is_dir():
            for item in sorted(p for p in path.rglob("*") if p.is_file()):
                if item.suffix.lower() in SUPPORTED_SUFFIXES:
                    files.append(IngestFile(item.relative_to(path).as_posix(), item.read_bytes()))
                elif skipped is not None:
                    skipped.append(item)
        elif path.is_file():
            files.append(IngestFile(path.name, path.read_bytes()))
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")
    return files


def check_files(files: Sequence[IngestFile], links: Sequence[str] = ()) -> None:
    """Refuse, before any work, a name given twice, a name `check_source_name` refuses, and
    a file whose type neither its name nor its `kind` tells.

    `links` are URLs not fetched yet: each will be named by itself and typed by what its
    server answers, so their names are checked with the files' before anything is fetched.
    """
    names = [*(item.source for item in files), *links]
    counts = Counter(names)
    duplicates = sorted(name for name, count in counts.items() if count > 1)
    if duplicates:
        raise InvalidRequest(f"files given more than once: {', '.join(duplicates)}")
    for link in links:
        check_source_name(link)
    for item in files:
        check_source_name(item.source)
        if item.kind is None and format_of(item.source) is None:
            suffix = Path(item.source).suffix.lower()
            raise UnsupportedFileType(
                f"{item.source}: unsupported file type {suffix or '(none)'}; supported: "
                + ", ".join(SUPPORTED_SUFFIXES)
            )


Pending = list[tuple[IngestFile, str, list[Chunk]]]


def _load_and_chunk(
    files: Sequence[IngestFile],
    known: dict[str, str],
    chunk_size: int,
    chunk_overlap: int,
    force: bool,
    limits: LoadLimits,
    request: RequestLimits | None = None,
) -> tuple[Pending, dict[str, IngestResult]]:
    """The files to embed (with their hash and chunks), and the unchanged ones' results;
    `request` bounds what the files to embed may expand to together."""
    pending: Pending = []
    results: dict[str, IngestResult] = {}
    budget = _Budget(request)
    for item in files:
        digest = content_hash(item.data, chunk_size, chunk_overlap)
        if not force and known.get(item.source) == digest:
            results[item.source] = IngestResult(item.source, "unchanged", 0)
            continue
        document = load_document(
            item.source, item.data, kind=item.kind, charset=item.charset, limits=limits
        )
        budget.add_text(item.source, text_chars(document))
        try:
            chunks = chunk_document(
                document,
                max_chars=chunk_size,
                overlap_chars=chunk_overlap,
                max_chunks=budget.chunks_left(),
            )
            count = len(chunks)
        except TooManyChunks as stopped:  # cut short past what was left: refused just below
            chunks, count = [], stopped.count
        budget.add_chunks(item.source, count)
        pending.append((item, digest, chunks))
    return pending, results


async def ingest_files(
    files: Sequence[IngestFile],
    embedder: Embedder,
    retriever: Retriever,
    *,
    chunk_size: int = 1200,
    chunk_overlap: int = 150,
    force: bool = False,
    limits: LoadLimits | None = None,
    per_request: RequestLimits | None = None,
    on_chunks_embedded: ProgressCallback | None = None,
    on_plan: Callable[[int], None] | None = None,
    parse_slot: ParseSlot | None = None,
    checked: bool = False,
) -> list[IngestResult]:
    """Ingest `files` into `retriever`; returns one result per file, in input order.

    The service parses on the slot its parse pool admitted the request to, under the
    slot's `working()` token, so uploads never take the threads other requests need;
    without one (the CLI), on asyncio's default pool. `checked` says the caller has run
    `check_files` on `files` already. `limits` bounds each file, `per_request` (when
    given: the service gives it, the CLI does not) all of them together.
    """
    if not checked:
        check_files(files)
    known = {info.source: info.content_hash for info in await retriever.list_sources()}
    # Hashing, parsing (a PDF can take seconds) and chunking are CPU-bound: a worker thread
    # does them, so other requests keep being served meanwhile.
    run = parse_slot.run if parse_slot is not None else asyncio.to_thread
    pending, results = await run(
        _load_and_chunk,
        files,
        known,
        chunk_size,
        chunk_overlap,
        force,
        limits if limits is not None else LoadLimits(),
        per_request,
    )

    total = sum(len(chunks) for _, _, chunks in pending)
    if on_plan is not None:
        on_plan(total)
    every_chunk = [chunk for _, _, chunks in pending for chunk in chunks]
    vectors = await _embed(every_chunk, embedder, on_chunks_embedded)
    if pending:
        matrix = np.vstack(vectors) if vectors else np.zeros((0, 0), dtype=np.float32)
        batches: list[SourceBatch] = []
        offset = 0
        for item, digest, chunks in pending:
            rows = matrix[offset : offset + len(chunks)]
            offset += len(chunks)
            batches.append(SourceBatch(item.source, chunks, rows, digest))
            results[item.source] = IngestResult(item.source, "ingested", len(chunks))
        await retriever.replace_sources(batches)
    return [results[item.source] for item in files]


async def _embed(
    chunks: Sequence[Chunk], embedder: Embedder, on_chunks_embedded: ProgressCallback | None
) -> list[np.ndarray]:
    """The chunks' vectors, a batch at a time; each batch's texts (title line and text) are
    built when it is sent, not all at once."""
    vectors: list[np.ndarray] = []
    for start in range(0, len(chunks), embedder.max_batch):
        batch = [chunk.indexed_text for chunk in chunks[start : start + embedder.max_batch]]
        vectors.append(await embedder.embed(batch))
        if on_chunks_embedded is not None:
            on_chunks_embedded(len(batch))
    return vectors
