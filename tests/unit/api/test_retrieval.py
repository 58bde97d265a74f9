"""The retriever service's route (OPEA's /v1/retrieval): given or computed embeddings, bad input."""

from __future__ import annotations

import json

import httpx2
import pytest

from chatqna.app import create_app
from chatqna.backends.fakes import HashingEmbedder
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio


async def _service(
    client_for: ClientFactory, settings: Settings, embedder: HashingEmbedder
) -> httpx2.AsyncClient:
    backends = await make_backends(settings, embedder=embedder)
    backends.reranker = None
    app = create_app(settings, backends, tracer_provider=TRACER_PROVIDER, role="retriever")
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    return httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://localhost:7000"
    )


async def test_uses_the_given_embedding_without_embedding_again(
    client_for: ClientFactory, settings: Settings
) -> None:
    embedder = HashingEmbedder()
    client = await _service(client_for, settings, embedder)
    vector = embedder.vector("data kept after cancellation")
    response = await client.post(
        "/v1/retrieval",
        json={"text": "Is that possible after I cancel?", "embedding": vector.tolist(), "k": 2},
    )
    assert response.status_code == 200
    body = response.json()
    assert embedder.batches == [], "the service must not embed when given an embedding"
    assert body["initial_query"] == "Is that possible after I cancel?"
    assert body["embedded_by_service"] is False
    assert len(body["retrieved_docs"]) == 2
    # The given embedding (not the text) finds the retention passage; fusion may rank the
    # export passage, which both legs find, above it.
    assert "retention.md" in {doc["metadata"]["source"] for doc in body["retrieved_docs"]}
    first = body["retrieved_docs"][0]
    assert set(first["metadata"]["scores"]) == {"dense", "bm25", "fusion"}


async def test_embeds_the_text_when_no_embedding_comes(
    client_for: ClientFactory, settings: Settings
) -> None:
    embedder = HashingEmbedder()
    client = await _service(client_for, settings, embedder)
    body = (
        await client.post("/v1/retrieval", json={"text": "annual refund", "k": 1, "hybrid": False})
    ).json()
    assert embedder.batches == [["annual refund"]]
    assert body["embedded_by_service"] is True
    assert body["retrieved_docs"][0]["metadata"]["source"] == "refunds.md"
    assert set(body["retrieved_docs"][0]["metadata"]["scores"]) == {"dense"}


async def test_thresholds_and_bad_embeddings(client_for: ClientFactory, settings: Settings) -> None:
    client = await _service(client_for, settings, HashingEmbedder())
    strict = await client.post("/v1/retrieval", json={"text": "refund", "score_threshold": 0.99})
    assert strict.json()["retrieved_docs"] == []
    wrong = await client.post("/v1/retrieval", json={"text": "x", "embedding": [0.1, 0.2]})
    assert wrong.status_code == 400 and "dimensions" in wrong.json()["message"]
    zero = await client.post("/v1/retrieval", json={"text": "x", "embedding": [0.0] * 64})
    assert zero.status_code == 400
    # Vectors whose float32 norm underflows or overflows are normalised all the same.
    for value in (1e-45, 1e38):
        scaled = await client.post("/v1/retrieval", json={"text": "x", "embedding": [value] * 64})
        assert scaled.status_code == 200
        assert all(doc["score"] is not None for doc in scaled.json()["retrieved_docs"])
    for weights in ([float("inf"), 0.0], [-1.0, 1.0]):
        bad = await client.post(
            "/v1/retrieval",
            content=json.dumps({"text": "x", "fusion_weights": weights}).encode(),
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 422
    assert (await client.post("/v1/retrieval", json={"k": 2})).status_code == 422
    assert (await client.post("/v1/chatqna", json={"messages": "hi"})).status_code == 404
