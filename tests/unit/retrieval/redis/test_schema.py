"""What the Redis stores ask of the server: a `maxmemory-policy` that never evicts, and an
index with the fields of the current format."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from redis.exceptions import ResponseError

from chatqna.errors import EvictingIndexServer, IndexUnavailable
from chatqna.retrieval.redis.schema import (
    FORMAT_VERSION,
    IndexInfo,
    IndexSchema,
    VectorIndexParams,
    refuse_eviction,
)

pytestmark = pytest.mark.anyio


class Server:
    """A client whose `CONFIG GET` and `INFO memory` answer `config` and `info`, or refuse
    (None: the command is renamed or disabled, as on managed services)."""

    def __init__(self, config: str | None, info: str | None) -> None:
        self.config, self.info_policy = config, info

    async def config_get(self, pattern: str) -> dict[str, Any]:
        if self.config is None:
            raise ResponseError("unknown command 'CONFIG'")
        return {pattern: self.config}

    async def info(self, section: str) -> dict[str, Any]:
        if self.info_policy is None:
            raise ResponseError("unknown command 'INFO'")
        return {"used_memory": 1, "maxmemory_policy": self.info_policy}


async def test_noeviction_is_accepted() -> None:
    await refuse_eviction(Server("noeviction", None), "here")  # type: ignore[arg-type]
    await refuse_eviction(Server(None, "noeviction"), "here")  # type: ignore[arg-type]


@pytest.mark.parametrize("config, info", [("volatile-lru", None), (None, "volatile-ttl")])
async def test_a_policy_that_evicts_only_keys_with_a_ttl_is_accepted(
    config: str | None, info: str | None
) -> None:
    # The index sets no time to live on any key, so these never evict its passages.
    await refuse_eviction(Server(config, info), "here")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "config, info", [("allkeys-lru", None), (None, "allkeys-lfu"), ("allkeys-random", None)]
)
async def test_an_evicting_policy_is_refused_with_the_way_out(
    config: str | None, info: str | None
) -> None:
    with pytest.raises(EvictingIndexServer) as caught:
        await refuse_eviction(Server(config, info), "redis://node:6379")  # type: ignore[arg-type]
    assert isinstance(caught.value, IndexUnavailable)
    message = caught.value.message
    assert "redis://node:6379" in message and (config or info) in message
    assert "--maxmemory-policy noeviction" in message


async def test_an_unknown_policy_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        await refuse_eviction(Server(None, None), "here")  # type: ignore[arg-type]
    assert "maxmemory-policy" in caplog.text


def ft_info(digest: list[bytes]) -> list[object]:
    """An `FT.INFO` reply (RESP2, as Redis Stack 7.4 words it) with a `digest` attribute."""
    terms = [b"identifier", b"terms", b"attribute", b"terms", b"type", b"TEXT", b"WEIGHT", b"1"]
    vector = [b"identifier", b"embedding", b"attribute", b"embedding", b"type", b"VECTOR"]
    return [
        b"num_docs", b"3", b"indexing", b"0", b"percent_indexed", b"1",
        b"attributes", [[*terms, b"NOSTEM"], [*vector, b"dim", b"8"], digest],
    ]  # fmt: skip


def test_an_index_holds_digests_only_when_the_field_is_sortable_as_stored() -> None:
    tag = [b"identifier", b"digest", b"attribute", b"digest", b"type", b"TAG", b"SEPARATOR", b","]
    current = IndexInfo.parse(ft_info([*tag, b"CASESENSITIVE", b"SORTABLE", b"UNF", b"NOINDEX"]))
    assert current.sortable_digest and current.has_terms and current.vector_dimension == "8"
    # Normalised (lower-cased) in the index, or not in it at all.
    assert not IndexInfo.parse(ft_info([*tag, b"SORTABLE", b"NOINDEX"])).sortable_digest
    assert not IndexInfo.parse(ft_info([b"identifier", b"other"])).sortable_digest


@pytest.mark.parametrize(
    ("meta", "found"),
    [({b"format": b"2"}, "has layout format 2"), ({}, "has layout format none")],
    ids=["another", "none"],
)
def test_a_meta_of_another_format_is_refused_with_one_way_out(
    meta: dict[bytes, bytes], found: str
) -> None:
    schema = IndexSchema("rag", "rag:chunk:", "e", 8, VectorIndexParams())
    schema.check_meta(
        {b"embedder": b"e", b"dimension": b"8", b"format": FORMAT_VERSION.encode()}, FORMAT_VERSION
    )
    with pytest.raises(IndexUnavailable) as refused:
        schema.check_meta({b"embedder": b"e", b"dimension": b"8", **meta}, FORMAT_VERSION)
    message = refused.value.message
    assert message.startswith(f"the Redis index 'rag' {found}; this version needs layout format")
    assert "FT.DROPINDEX rag DD" in message and "rag-shard-{n}" in message
