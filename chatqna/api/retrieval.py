"""OPEA's retriever contract, `POST /v1/retrieval`, for the standalone retriever service.

In: `text`, an optional `embedding` (used as given: the text is embedded only when no
embedding comes), `k`, and OPEA's search parameters (`search_type`, `distance_threshold`,
`fetch_k`, `lambda_mult`, `score_threshold`, `index_name`), of which `distance_threshold`
(cosine distance, kept when <= the threshold) and `score_threshold` (cosine similarity,
kept when >= it) filter the results and the others are accepted and ignored. `hybrid` (our
extension) picks hybrid or dense-only search for this request. Out: OPEA's `SearchedDoc`
shape, `retrieved_docs` with `id`, `text`, `score` and `metadata` (source, title, chunk
index, per-leg scores).
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends

from chatqna.api.deps import State, require_api_key
from chatqna.api.error_schemas import ANY_ROUTE, error_responses
from chatqna.api.guards import require_json_body
from chatqna.api.retrieval_schemas import (
    RetrievalRequest,
    RetrievalResponse,
    RetrievedDoc,
    RetrievedMetadata,
)
from chatqna.backends.protocols import SearchQuery, embedding_dimension
from chatqna.documents import ScoredChunk
from chatqna.errors import InvalidRequest

router = APIRouter(
    dependencies=[Depends(require_api_key)],
    tags=["retrieval"],
    responses=error_responses(401, *ANY_ROUTE),
)


def _document(item: ScoredChunk) -> RetrievedDoc:
    chunk = item.chunk
    metadata = RetrievedMetadata(
        source=chunk.source,
        title=chunk.title,
        doc_id=chunk.doc_id,
        chunk_index=chunk.index,
        scores=dict(item.scores),
    )
    return RetrievedDoc(id=chunk.id, text=chunk.text, score=item.score, metadata=metadata)


@router.post(
    "/v1/retrieval",
    summary="Retrieve chunks for a text and/or an embedding",
    response_model=RetrievalResponse,
    responses=error_responses(400, 403, 415, 422, 502, 503, 504),
    dependencies=[Depends(require_json_body)],
)
async def retrieve(body: RetrievalRequest, state: State) -> dict[str, Any]:
    backends = state.backends
    if body.embedding is not None:
        # Normalised in float64: in float32 a tiny vector's norm is 0 and a huge one's infinite.
        vector64 = np.asarray(body.embedding, dtype=np.float64)
        with np.errstate(over="ignore"):  # a huge vector's norm overflows to inf, refused below
            norm = float(np.linalg.norm(vector64)) if vector64.ndim == 1 else 0.0
        if not np.isfinite(vector64).all() or not 0.0 < norm < np.inf:
            raise InvalidRequest("embedding must be a non-zero list of finite numbers")
        vector = (vector64 / norm).astype(np.float32)
        expected = await embedding_dimension(backends.embedder)
        if vector.shape[0] != expected:
            raise InvalidRequest(
                f"embedding has {vector.shape[0]} dimensions; this index holds {expected}"
            )
    else:
        vector = (await backends.embedder.embed([body.text]))[0]
    hybrid = (
        body.hybrid
        if body.hybrid is not None
        else state.settings.retriever_hybrid_retrieval_enabled
    )
    weights = body.fusion_weights
    if weights is None:
        weights = state.settings.fusion_weights
    hits = await backends.retriever.search(
        SearchQuery(body.text, vector, body.k, hybrid, fusion_weights=weights)
    )
    # Cosine distance is 1 - similarity: a distance threshold t keeps similarity >= 1 - t.
    if body.distance_threshold is not None:
        hits = [h for h in hits if h.scores["dense"] >= 1.0 - body.distance_threshold]
    if body.score_threshold is not None:
        hits = [h for h in hits if h.scores["dense"] >= body.score_threshold]
    return {
        "id": uuid.uuid4().hex,
        "retrieved_docs": [_document(hit) for hit in hits],
        "initial_query": body.text,
        "top_n": body.k,
        "embedded_by_service": body.embedding is None,
    }
