"""The retrieval endpoint's wire models: `POST /v1/retrieval` (OPEA's `EmbedDoc` in,
`SearchedDoc` out)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# A leg's weight in the fusion: finite and not negative (an infinite one makes every score NaN).
Weight = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class RetrievalRequest(BaseModel):
    """OPEA's `EmbedDoc`: the query text and, optionally, its embedding."""

    model_config = ConfigDict(extra="ignore")

    text: str = Field(min_length=1)
    embedding: list[float] | None = None
    k: int = Field(4, ge=1, le=100)
    search_type: str = "similarity"
    hybrid: bool | None = None
    fusion_weights: tuple[Weight, Weight] | None = None
    distance_threshold: float | None = None
    score_threshold: float | None = None
    fetch_k: int | None = None
    lambda_mult: float | None = None
    index_name: str | None = None


class RetrievedMetadata(BaseModel):
    """Where a retrieved chunk comes from, and its score in each retrieval leg."""

    source: str
    title: str
    doc_id: str
    chunk_index: int
    scores: dict[str, float]


class RetrievedDoc(BaseModel):
    """One chunk of OPEA's `SearchedDoc.retrieved_docs`."""

    id: str
    text: str
    score: float
    metadata: RetrievedMetadata


class RetrievalResponse(BaseModel):
    """Body of `POST /v1/retrieval` (OPEA's `SearchedDoc`)."""

    id: str
    retrieved_docs: list[RetrievedDoc]
    initial_query: str
    top_n: int
    embedded_by_service: bool
