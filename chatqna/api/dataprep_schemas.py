"""The dataprep endpoints' wire models: `POST /v1/dataprep/ingest`, `/get` and `/delete`.

Optional multipart form fields are documented without `null`, which a form cannot carry.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import File, Form, UploadFile
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema


class DataprepDeleteRequest(BaseModel):
    """Body of `POST /v1/dataprep/delete`: a source name, or `all`."""

    model_config = ConfigDict(extra="ignore")
    file_path: str = Field(min_length=1)


# A form field is either absent or a string: `null` is not something a client can send.
IngestFiles = Annotated[
    list[UploadFile] | None,
    File(description="files to ingest (txt, md, html, pdf, docx, pptx, xlsx, csv, json, jsonl)"),
]
LinkList = Annotated[
    str | None,
    Form(description="OPEA's URL list: a JSON list of http(s) URLs to fetch and ingest"),
    WithJsonSchema({"type": "string"}),
]
ChunkSize = Annotated[
    int | None,
    Form(ge=100, le=20000),
    WithJsonSchema({"type": "integer", "minimum": 100, "maximum": 20000}),
]
ChunkOverlap = Annotated[
    int | None,
    Form(ge=0, le=10000, description="must be smaller than chunk_size"),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 10000}),
]


class IngestedFile(BaseModel):
    """What ingesting one uploaded file did."""

    name: str
    status: str
    chunks: int


class IngestReport(BaseModel):
    """Body of `POST /v1/dataprep/ingest`."""

    status: int
    message: str
    files: list[IngestedFile]


class SourceEntry(BaseModel):
    """One ingested file in `POST /v1/dataprep/get` (OPEA's file-structure shape)."""

    name: str
    id: str
    type: Literal["File"]
    parent: str
    chunks: int


class DeleteReport(BaseModel):
    """Body of `POST /v1/dataprep/delete`."""

    status: bool
    removed_chunks: int
