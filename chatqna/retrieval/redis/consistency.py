"""One search response reads its passages at the versions its ranking saw.

A hybrid search ranks in one round trip (KNN + BM25, fused in the client; on a cluster, one
per primary, and a dense-only search too) and reads the ranked passages with `HMGET` in a
second. Chunk ids are positional (`chatqna.documents.chunk_id_for`), so a write committed
in between would swap a passage's content under a key already ranked (new text, scored for
the old) or delete it. So the ranking legs return each hit's `digest`, which every write
stores with the passage (`writes.chunk_digest`: its text, source, title, position and
vector) and the index holds as a sortable field (a cluster node returns no other stored
field with a hit), and the read compares it with the stored one. A passage gone or stored
at another version makes the store rank once more (`READ_ATTEMPTS`); a passage still
changed after that is dropped, so the response may hold fewer than `k` passages, never one
scored for text it does not carry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

READ_ATTEMPTS = 2  # one ranking, and one more when a write changed what it ranked
Fields = dict[str, Any]
# What two legs that saw a passage at two versions (a write between their commands) record:
# equal to no stored digest.
DISAGREED = object()


@dataclasses.dataclass(frozen=True)
class Ranking:
    """A search's fused passages by key, each leg's scores, and the digest each passage
    had when the legs ranked it."""

    fused: list[tuple[str, float]]
    dense: dict[str, float]
    bm25: dict[str, float]
    digests: dict[str, Any]

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.fused]


def seen_digests(*legs: Mapping[str, Any]) -> dict[str, Any]:
    """Each key's digest as the ranking legs saw it; `DISAGREED` where two legs saw it at
    two versions."""
    seen: dict[str, Any] = {}
    for leg in legs:
        for key, digest in leg.items():
            seen[key] = digest if seen.get(key, digest) == digest else DISAGREED
    return seen


def current_rows(ranking: Ranking, rows: Sequence[Fields | None]) -> list[Fields | None]:
    """`rows` (the fused passages' stored fields), None where a passage is gone or is not
    at the version it was ranked at."""
    return [
        None if fields is None or fields.get("digest") != ranking.digests.get(key) else fields
        for key, fields in zip(ranking.keys, rows, strict=True)
    ]


async def read_ranked(
    rank: Callable[[], Awaitable[Ranking]],
    read: Callable[[Sequence[str]], Awaitable[list[Fields | None]]],
) -> tuple[Ranking, list[Fields | None]]:
    """`rank()`, then `read()` its passages; rank and read again when a passage changed in
    between, and drop (None) what changed again."""
    for _ in range(READ_ATTEMPTS):
        ranking = await rank()
        rows = current_rows(ranking, await read(ranking.keys))
        if all(fields is not None for fields in rows):
            break
    return ranking, rows
