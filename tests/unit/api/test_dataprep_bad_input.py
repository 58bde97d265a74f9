"""Bad input through `POST /v1/dataprep/ingest`: a clear envelope, and nothing changed.

Each request carries a good file next to the bad one: neither is ingested, and every
source already in the index keeps its chunks.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from chatqna.ingest.dataprep import IngestFile
from chatqna.ingest.links import LinkFetcher
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends
from tests.unit.ingest.office_files import (
    empty_paragraphs_docx,
    handbook_docx,
    million_cell_xlsx,
    ole_file,
    price_list_xlsx,
    zip_bomb,
)

pytestmark = pytest.mark.anyio

GOOD = ("fresh.md", b"# Fresh\n\n## New\nA brand new page that must not appear.\n")


async def _sources(client: Any) -> dict[str, int]:
    listing = (await client.post("/v1/dataprep/get")).json()
    return {item["name"]: item["chunks"] for item in listing}


def multipart(parts: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart body written byte for byte, so a file name reaches the service exactly
    as given (httpx2 would percent-encode control characters in it)."""
    boundary = "chatqna-test-boundary"
    body = b""
    for name, data in parts:
        body += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
                f'filename="{name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
            ).encode()
            + data
            + b"\r\n"
        )
    body += f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


async def _refused(client: Any, name: str, data: bytes) -> dict[str, Any]:
    before = await _sources(client)
    body, content_type = multipart([GOOD, (name, data)])
    response = await client.post(
        "/v1/dataprep/ingest", content=body, headers={"content-type": content_type}
    )
    assert await _sources(client) == before
    assert GOOD[0] not in before
    body: dict[str, Any] = response.json()
    body["status"] = response.status_code
    return body


@pytest.mark.parametrize(
    ("name", "data", "status", "error", "reason"),
    [
        ("broken.docx", b"PK\x03\x04 truncated", 422, "document_unreadable", "corrupt"),
        ("broken.xlsx", handbook_docx()[:2000], 422, "document_unreadable", "corrupt"),
        (
            "locked.xlsx",
            ole_file(["Root Entry", "EncryptionInfo", "EncryptedPackage"]),
            422,
            "document_unreadable",
            "encrypted",
        ),
        (
            "locked.docx",
            ole_file(["Root Entry", "EncryptionInfo", "EncryptedPackage"]),
            422,
            "document_unreadable",
            "encrypted",
        ),
    ],
)
async def test_corrupt_and_password_protected_office_files(
    client_for: ClientFactory, name: str, data: bytes, status: int, error: str, reason: str
) -> None:
    body = await _refused(await client_for(), name, data)
    assert (body["status"], body["error"], body["reason"]) == (status, error, reason)
    assert name in body["message"]


async def test_a_million_cell_spreadsheet_is_413(client_for: ClientFactory) -> None:
    body = await _refused(await client_for(), "million.xlsx", million_cell_xlsx())
    assert (body["status"], body["error"]) == (413, "payload_too_large")
    assert "CHATQNA_DATAPREP_MAX_CELLS" in body["message"]


@pytest.mark.parametrize(
    ("name", "build", "part"),
    [
        ("bomb.xlsx", price_list_xlsx, "xl/media/zeros.bin"),
        ("bomb.docx", handbook_docx, "word/media/zeros.bin"),
    ],
)
async def test_a_zip_bomb_inside_an_office_file_is_413(
    client_for: ClientFactory, settings: Settings, name: str, build: Any, part: str
) -> None:
    small = settings.model_copy(update={"chatqna_dataprep_max_unpacked_bytes": 16 << 20})
    client = await client_for(await make_backends(small), small)
    body = await _refused(client, name, zip_bomb(build(), part, 64 << 20))
    assert (body["status"], body["error"]) == (413, "payload_too_large")
    assert body["details"]["unpacked_bytes"] > 64 << 20


@pytest.mark.parametrize(
    ("paragraphs", "max_cells", "says"),
    [
        (2_000_000, 200_000, "word/document.xml unpacks to"),  # 12 MB of XML, 30 KiB zipped
        (5_000, 1_000, "CHATQNA_DATAPREP_MAX_CELLS"),
    ],
)
async def test_a_docx_of_empty_paragraphs_is_a_fast_413(
    client_for: ClientFactory, settings: Settings, paragraphs: int, max_cells: int, says: str
) -> None:
    limited = settings.model_copy(update={"chatqna_dataprep_max_cells": max_cells})
    client = await client_for(await make_backends(limited), limited)
    started = time.perf_counter()
    body = await _refused(client, "empty.docx", empty_paragraphs_docx(paragraphs))
    assert time.perf_counter() - started < 10  # minutes of reading nothing, before
    assert (body["status"], body["error"]) == (413, "payload_too_large")
    assert says in body["message"]


async def test_a_json_file_that_is_one_huge_string_is_413(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_dataprep_max_text_chars": 1_000_000})
    client = await client_for(await make_backends(small), small)
    body = await _refused(client, "huge.json", json.dumps("lorem " * 400_000).encode())
    assert (body["status"], body["error"]) == (413, "payload_too_large")
    assert "CHATQNA_DATAPREP_MAX_TEXT_CHARS" in body["message"]


@pytest.mark.parametrize(
    "name", ["evil\x00.md", "two\nlines.md", "esc\x1b[31m.md", "rtl\u202egpj.md"]
)
async def test_a_file_name_with_control_characters_is_400(
    client_for: ClientFactory, name: str
) -> None:
    body = await _refused(await client_for(), name, b"# Fine\n\nfine text")
    assert (body["status"], body["error"], body["reason"]) == (
        400,
        "invalid_request",
        "bad_file_name",
    )
    assert body["details"]["source"] == name


@pytest.mark.parametrize("piece", [3, 1 << 20])
@pytest.mark.parametrize(
    "spelling",
    [str, str.title, lambda t: t.replace(";", " ;")],
    ids=["lowercase", "title-case", "space-before-semicolon"],
)
async def test_an_upload_cut_short_before_its_closing_boundary_is_400(
    client_for: ClientFactory, piece: int, spelling: Callable[[str], str]
) -> None:
    # The form parser drops an unfinished last part silently: the file before it would be
    # ingested alone. It reads `Multipart/Form-Data` (or a space before the `;`) as an
    # upload too: media types are case-insensitive.
    client = await client_for()
    before = await _sources(client)
    body, form_type = multipart([GOOD, ("second.md", b"# Second\n\nall of it")])
    kind, boundary = form_type.split(";", 1)
    content_type = spelling(kind + ";") + boundary

    async def in_pieces(data: bytes) -> AsyncIterator[bytes]:
        for start in range(0, len(data), piece):  # the delimiter split across reads
            yield data[start : start + piece]

    cut = await client.post(
        "/v1/dataprep/ingest",
        content=in_pieces(body[: body.rindex(b"--chatqna-test-boundary--") - 2]),
        headers={"content-type": content_type},
    )
    assert cut.status_code == 400, cut.text
    assert cut.json()["error"] == "invalid_request"
    assert "closing boundary" in cut.json()["message"]
    assert await _sources(client) == before
    whole = await client.post(
        "/v1/dataprep/ingest", content=in_pieces(body), headers={"content-type": content_type}
    )
    assert whole.status_code == 200, whole.text
    assert [f["name"] for f in whole.json()["files"]] == [GOOD[0], "second.md"]


@pytest.mark.parametrize(
    "urls",
    [["https://pages.test/a.html", "https://pages.test/a.html"], ["https://pages.test/\u202ea"]],
    ids=["given-twice", "control-character"],
)
async def test_links_whose_names_are_refused_are_never_fetched(
    client_for: ClientFactory, monkeypatch: pytest.MonkeyPatch, urls: list[str]
) -> None:
    fetched: list[str] = []

    async def fetch_all(self: LinkFetcher, links: list[str]) -> list[Any]:
        fetched.extend(links)
        return [IngestFile(url, b"<p>page</p>", kind="html") for url in links]

    monkeypatch.setattr(LinkFetcher, "fetch_all", fetch_all)
    client = await client_for()
    response = await client.post("/v1/dataprep/ingest", data={"link_list": json.dumps(urls)})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"
    assert fetched == []
