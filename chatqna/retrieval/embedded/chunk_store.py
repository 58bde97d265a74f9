"""The embedded index's store of record: chunks, vectors and sources in one SQLite file.

`<index dir>/chunks.sqlite3`, in WAL mode so readers in any process never wait for the
writer. Every write request is one transaction: the rows of each replaced source are
deleted and the new ones inserted, the source's hash updated and the `generation` counter
bumped together, so a killed or failed write leaves every source fully old or fully new.

Rows get increasing ids (`AUTOINCREMENT` never reuses one), and a deleted row is logged in
`removed` with the generation that removed it. A process that has read the store up to
generation `g` catches up with two indexed range reads: rows above the last id it holds,
and rows removed after `g`. The lexical index (`chatqna.retrieval.embedded.lexical`) is derived
from this store; `lexical_generation` records which generation it reflects.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chatqna.backends.protocols import SourceBatch, SourceInfo
from chatqna.documents import Chunk, indexed_text
from chatqna.errors import IndexUnavailable

STORE_FILE = "chunks.sqlite3"
FORMAT_VERSION = 2
REBUILD_HINT = "rebuild it with `chatqna ingest --rebuild <paths>`"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (
    source TEXT PRIMARY KEY, content_hash TEXT NOT NULL, chunks INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    row INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL, source TEXT NOT NULL, title TEXT NOT NULL, position INTEGER NOT NULL,
    text TEXT NOT NULL, embedding BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_source ON chunks (source);
CREATE TABLE IF NOT EXISTS removed (row INTEGER PRIMARY KEY, generation INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS removed_by_generation ON removed (generation);
"""


@dataclass(frozen=True)
class Delta:
    """What changed after a generation: rows added (ids ascending, vectors) and removed."""

    generation: int
    added: np.ndarray  # int64 row ids
    vectors: np.ndarray  # (len(added), dimension) float32
    removed: np.ndarray  # int64 row ids


@dataclass(frozen=True)
class Generations:
    store: int
    lexical: int


class ChunkStore:
    """SQLite access for one index directory; one connection per thread, WAL mode."""

    def __init__(self, directory: Path, dimension: int) -> None:
        self.path = directory / STORE_FILE
        self.dimension = dimension
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._opened_lock = threading.Lock()

    def connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                self.path, timeout=60.0, isolation_level=None, check_same_thread=False
            )
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; atomic
            connection.execute("PRAGMA busy_timeout=60000")
            # After a large write, give the WAL file's space back once it is checkpointed.
            connection.execute("PRAGMA journal_size_limit=67108864")
            self._local.connection = connection
            with self._opened_lock:
                self._opened.append(connection)
        return connection

    def create(self, embedder: str) -> None:
        """Create the tables if missing and record format and embedder on a new store."""
        db = self.connection()
        db.executescript(_SCHEMA)
        with _transaction(db):
            for key, value in (
                ("format", str(FORMAT_VERSION)),
                ("embedder", embedder),
                ("dimension", str(self.dimension)),
                ("generation", "0"),
                ("lexical_generation", "0"),
            ):
                db.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (key, value))

    def meta(self) -> dict[str, str]:
        return dict(self.connection().execute("SELECT key, value FROM meta").fetchall())

    def check_meta(self, embedder: str) -> None:
        """Refuse (`IndexUnavailable`) a store of another format, or one built with another
        embedder or dimension than `embedder` and this store's."""
        meta = self.meta()
        if meta.get("format") != str(FORMAT_VERSION):
            raise IndexUnavailable(
                f"{self.path}: unknown index format {meta.get('format')!r}; {REBUILD_HINT}"
            )
        built, width = meta.get("embedder"), int(meta.get("dimension", "-1"))
        if built != embedder or width != self.dimension:
            raise IndexUnavailable(
                f"the index at {self.path.parent} was built with embedder {built!r} ({width} "
                f"dimensions); the configured embedder is {embedder!r} "
                f"({self.dimension}). Switch the embedder back, or {REBUILD_HINT}."
            )

    def generations(self) -> Generations:
        values = dict(
            self.connection()
            .execute(
                "SELECT key, value FROM meta WHERE key IN ('generation', 'lexical_generation')"
            )
            .fetchall()
        )
        return Generations(int(values["generation"]), int(values["lexical_generation"]))

    # --- writes (the caller holds the writer lock) -------------------------------------------
    def replace(self, batches: Sequence[SourceBatch]) -> tuple[int, list[tuple[int, str, str]]]:
        """Replace the batches' sources in one transaction; return the new generation and
        the new rows as `(row, source, indexed text)`, what the lexical index holds."""
        db = self.connection()
        documents: list[tuple[int, str, str]] = []
        with _transaction(db):
            generation = self._bump(db)
            for batch in batches:
                self._remove(db, [batch.source], generation)
                vectors = np.ascontiguousarray(batch.embeddings, dtype=np.float32)
                # AUTOINCREMENT under the writer lock: the new rows follow the last id given.
                found = db.execute("SELECT seq FROM sqlite_sequence WHERE name='chunks'")
                last = found.fetchone()
                first = (int(last[0]) if last else 0) + 1
                db.executemany(
                    "INSERT INTO chunks (row, id, source, title, position, text, embedding) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        (
                            first + i,
                            c.id,
                            batch.source,
                            c.title,
                            c.index,
                            c.text,
                            vectors[i].tobytes(),
                        )
                        for i, c in enumerate(batch.chunks)
                    ),
                )
                documents += [
                    (first + i, batch.source, c.indexed_text) for i, c in enumerate(batch.chunks)
                ]
                db.execute(
                    "INSERT OR REPLACE INTO sources VALUES (?, ?, ?)",
                    (batch.source, batch.content_hash, len(batch.chunks)),
                )
        return generation, documents

    def delete(self, sources: Sequence[str] | None) -> tuple[int, int, list[str]]:
        """Delete these sources (all when None); return (chunks removed, generation, the
        sources deleted)."""
        db = self.connection()
        with _transaction(db):
            if sources is None:
                sources = [s for (s,) in db.execute("SELECT source FROM sources")]
            known = [s for s in dict.fromkeys(sources) if self._has_source(db, s)]
            if not known:
                return 0, self._generation(db), []
            generation = self._bump(db)
            removed = self._remove(db, known, generation)
        return removed, generation, known

    def set_lexical_generation(self, generation: int) -> None:
        db = self.connection()
        with _transaction(db):
            db.execute("UPDATE meta SET value=? WHERE key='lexical_generation'", (str(generation),))

    @staticmethod
    def _has_source(db: sqlite3.Connection, source: str) -> bool:
        found = db.execute("SELECT 1 FROM sources WHERE source=?", (source,)).fetchone()
        return found is not None

    @staticmethod
    def _generation(db: sqlite3.Connection) -> int:
        return int(db.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])

    @classmethod
    def _bump(cls, db: sqlite3.Connection) -> int:
        db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key='generation'")
        return cls._generation(db)

    @staticmethod
    def _remove(db: sqlite3.Connection, sources: Sequence[str], generation: int) -> int:
        removed = 0
        for source in sources:
            db.execute(
                "INSERT OR REPLACE INTO removed SELECT row, ? FROM chunks WHERE source=?",
                (generation, source),
            )
            removed += db.execute("DELETE FROM chunks WHERE source=?", (source,)).rowcount
            db.execute("DELETE FROM sources WHERE source=?", (source,))
        return removed

    # --- reads -------------------------------------------------------------------------------
    def delta(self, after_generation: int, after_row: int) -> Delta:
        """Rows added with an id above `after_row` and rows removed after `after_generation`,
        read in one snapshot."""
        db = self.connection()
        with _transaction(db, "BEGIN"):
            generation = self._generation(db)
            added = db.execute(
                "SELECT row, embedding FROM chunks WHERE row > ? ORDER BY row", (after_row,)
            ).fetchall()
            # A first load reads live rows only: no earlier removal concerns it.
            removed = (
                db.execute(
                    "SELECT row FROM removed WHERE generation > ?", (after_generation,)
                ).fetchall()
                if after_generation >= 0
                else []
            )
        rows = np.fromiter((r for r, _ in added), dtype=np.int64, count=len(added))
        vectors = np.frombuffer(b"".join(v for _, v in added), dtype=np.float32)
        return Delta(
            generation,
            rows,
            vectors.reshape(len(added), self.dimension),
            np.fromiter((r for (r,) in removed), dtype=np.int64, count=len(removed)),
        )

    def chunks(self, rows: Iterable[int]) -> dict[int, Chunk]:
        wanted = list(rows)
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        found = self.connection().execute(
            f"SELECT row, id, text, source, title, position FROM chunks WHERE row IN ({marks})",
            wanted,
        )
        return {
            row: Chunk(cid, text, source, title, pos)
            for row, cid, text, source, title, pos in found
        }

    def texts(self, batch: int = 5000) -> Iterable[list[tuple[int, str, str]]]:
        """Every (row, source, indexed text), in batches, for rebuilding the lexical index."""
        cursor = self.connection().execute(
            "SELECT row, source, title, text FROM chunks ORDER BY row"
        )
        while rows := cursor.fetchmany(batch):
            yield [(row, source, indexed_text(title, text)) for row, source, title, text in rows]

    def sources(self) -> list[SourceInfo]:
        found = self.connection().execute(
            "SELECT source, chunks, content_hash FROM sources ORDER BY source"
        )
        return [SourceInfo(source=s, chunks=n, content_hash=h) for s, n, h in found]

    def content_hash(self, source: str) -> str | None:
        found = (
            self.connection()
            .execute("SELECT content_hash FROM sources WHERE source=?", (source,))
            .fetchone()
        )
        return None if found is None else str(found[0])

    def source_count(self) -> int:
        return int(self.connection().execute("SELECT count(*) FROM sources").fetchone()[0])

    def close(self) -> None:
        """Close every thread's connection (the threads themselves may be gone)."""
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for connection in opened:
            connection.close()
        self._local = threading.local()


class _transaction:
    """`BEGIN IMMEDIATE` (a write) or `BEGIN` (a consistent read) ... COMMIT, or ROLLBACK."""

    def __init__(self, db: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> None:
        self.db = db
        self.begin = begin

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute(self.begin)
        return self.db

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")
