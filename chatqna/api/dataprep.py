"""OPEA-style dataprep endpoints: ingest uploaded files and links, list and delete sources.

- `POST /v1/dataprep/ingest`: multipart form with `files` (repeated) and/or `link_list`
  (a JSON list of URLs); optional `chunk_size`, `chunk_overlap`. Re-uploading a file or
  re-sending a link replaces its chunks. The request takes its place in the parse pool
  before its body is read (`chatqna.api.guards.IngestAdmission`: 429 when all the pool's
  places for requests in flight are taken). Once its body is in, it waits its turn for one
  of the pool's tokens (at most `workers` requests hold their files and pages in memory at
  once); a client that disconnects meanwhile ends the wait (`chatqna.api.disconnects`):
  the request writes nothing, gives its place back and is counted as 499. Holding the
  token, it no longer watches its client: it reads its uploads, checks the uploads' names
  and types and the links' names, fetches the links, parses on one of the pool's threads,
  and ingests everything in one all-or-nothing step.
- `POST /v1/dataprep/get`: the ingested sources.
- `POST /v1/dataprep/delete`: `{"file_path": "<source>"}` or `{"file_path": "all"}`; a
  name that is neither listed nor has chunks is 404.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response, UploadFile

from chatqna.api.dataprep_schemas import (
    ChunkOverlap,
    ChunkSize,
    DataprepDeleteRequest,
    DeleteReport,
    IngestFiles,
    IngestReport,
    LinkList,
    SourceEntry,
)
from chatqna.api.deps import State, require_api_key
from chatqna.api.disconnects import CLIENT_CLOSED_REQUEST, ClientDisconnected, while_connected
from chatqna.api.error_schemas import ANY_ROUTE, error_responses
from chatqna.api.guards import require_json_body
from chatqna.api.ingest_admission import PARSE_SLOT
from chatqna.errors import InvalidRequest, NotFound, PayloadTooLarge
from chatqna.ingest import office
from chatqna.ingest.dataprep import (
    IngestFile,
    check_files,
    ingest_files,
    load_limits,
    request_limits,
)
from chatqna.ingest.links import LinkFetcher, parse_link_list
from chatqna.ingest.parse_pool import ParseSlot

logger = logging.getLogger(__name__)
router = APIRouter(
    dependencies=[Depends(require_api_key)],
    tags=["dataprep"],
    responses=error_responses(401, 503, *ANY_ROUTE),
)


def startup_warnings() -> list[str]:
    """The files this process refuses to ingest, and why (logged once at start-up)."""
    return office.startup_warnings()


async def link_fetcher(state: State) -> LinkFetcher:
    """The fetcher for `link_list`; tests override this dependency with a fake resolver."""
    return LinkFetcher(state.settings)


Fetcher = Annotated[LinkFetcher, Depends(link_fetcher)]


async def parse_slot(request: Request) -> ParseSlot:
    """The request's place in the parse pool, taken before its body was read."""
    slot: ParseSlot = request.scope[PARSE_SLOT]
    return slot


Admitted = Annotated[ParseSlot, Depends(parse_slot)]


async def _read_upload(upload: UploadFile, limit: int) -> IngestFile:
    name = (upload.filename or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name:
        raise InvalidRequest("every uploaded file needs a file name")
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"{name} is larger than {limit} bytes (CHATQNA_MAX_UPLOAD_BYTES)")
    return IngestFile(name, data)


@router.post(
    "/v1/dataprep/ingest",
    summary="Ingest uploaded files and linked pages into the knowledge base",
    response_model=IngestReport,
    responses=error_responses(400, 403, 408, 415, 422, 429, 501, 502, 504),
)
async def ingest(
    state: State,
    fetcher: Fetcher,
    slot: Admitted,
    request: Request,
    files: IngestFiles = None,
    link_list: LinkList = None,
    chunk_size: ChunkSize = None,
    chunk_overlap: ChunkOverlap = None,
) -> dict[str, Any] | Response:
    settings = state.settings
    urls = parse_link_list(link_list, settings.chatqna_dataprep_max_links)
    if not files and not urls:
        raise InvalidRequest(
            "nothing to ingest: send multipart fields named 'files', or 'link_list' with a "
            "JSON list of URLs"
        )
    size = chunk_size if chunk_size is not None else settings.chunk_size
    overlap = chunk_overlap if chunk_overlap is not None else settings.chunk_overlap
    if overlap >= size:
        raise InvalidRequest("chunk_overlap must be smaller than chunk_size")
    # Admitted before the body was read, so a request the pool refused (429) cost nothing.
    # The body is in (spooled to disk), so what `receive` gives next is the client's
    # disconnect, which ends the wait for a token; once the token is held, the client is
    # no longer watched and the write is all or nothing as ever. Its files and pages are
    # held in memory only under one of the pool's `workers` tokens, until they are written.
    try:
        async with slot.working(partial(while_connected, request.receive)):
            limit = settings.chatqna_max_upload_bytes
            uploads = [await _read_upload(f, limit) for f in files or []]
            check_files(uploads, urls)  # a bad name fails the request before a link is fetched
            pages = await fetcher.fetch_all(urls)
            results = await ingest_files(
                [*uploads, *pages],
                state.backends.embedder,
                state.backends.retriever,
                chunk_size=size,
                chunk_overlap=overlap,
                limits=load_limits(settings),
                per_request=request_limits(settings),
                parse_slot=slot,
                checked=True,
            )
    except ClientDisconnected:
        logger.info("the client left while its upload waited for a parse token: nothing written")
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return {
        "status": 200,
        "message": "Data preparation succeeded",
        "files": [{"name": r.source, "status": r.status, "chunks": r.chunks} for r in results],
    }


@router.post(
    "/v1/dataprep/get",
    summary="List the ingested files",
    response_model=list[SourceEntry],
    responses=error_responses(403),
)
async def list_files(state: State) -> list[dict[str, Any]]:
    sources = await state.backends.retriever.list_sources()
    return [
        {"name": s.source, "id": s.source, "type": "File", "parent": "", "chunks": s.chunks}
        for s in sources
    ]


@router.post(
    "/v1/dataprep/delete",
    summary="Delete a file's chunks, or all of them",
    response_model=DeleteReport,
    responses=error_responses(400, 403, 404, 415, 422, 501),
    dependencies=[Depends(require_json_body)],
)
async def delete_files(body: DataprepDeleteRequest, state: State) -> dict[str, Any]:
    retriever = state.backends.retriever
    if body.file_path == "all":
        removed = await retriever.delete_sources(None)
        return {"status": True, "removed_chunks": removed}
    known = {s.source for s in await retriever.list_sources()}
    # Deleted whatever the listing said, and 404 only when the name was not listed and the
    # delete found nothing: the listing is read first, so another request may write the
    # source between the two, and its chunks must still go.
    removed = await retriever.delete_sources([body.file_path])
    if removed == 0 and body.file_path not in known:
        raise NotFound(f"no ingested file named {body.file_path!r}")
    return {"status": True, "removed_chunks": removed}
