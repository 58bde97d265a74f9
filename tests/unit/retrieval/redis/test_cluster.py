"""The Redis Cluster store once it is closed: work is refused as the service shutting
down, not sent over clients the topology would build again."""

from __future__ import annotations

import numpy as np
import pytest

from chatqna.backends.protocols import SearchQuery
from chatqna.errors import ServiceUnavailable
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex

pytestmark = pytest.mark.anyio


class ClusterClient:
    """The cluster client's one use here: being closed."""

    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_work_that_reaches_a_closed_cluster_store_is_refused_as_a_shutdown() -> None:
    cluster = ClusterClient()
    index = RedisClusterHybridIndex(
        cluster,  # type: ignore[arg-type]
        "redis://127.0.0.1:7000",
        embedder_name="e",
        dimension=4,
    )
    await index.aclose()
    assert cluster.closed == 1
    calls = {
        "search": lambda: index.search(SearchQuery("refund", np.ones(4, np.float32), 4)),
        "list_sources": index.list_sources,
        "describe": index.describe,
        "delete_sources": lambda: index.delete_sources(None),
    }
    for name, call in calls.items():
        with pytest.raises(ServiceUnavailable, match=r"'rag-redis' is closed") as refused:
            await call()
        assert refused.value.status_code == 503, name
    assert index.topology._clients == {}  # no client built again for the refused work
