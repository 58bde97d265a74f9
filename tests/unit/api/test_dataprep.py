"""Dataprep endpoints: ingest, list, re-ingest, delete; bad files and size limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends

pytestmark = pytest.mark.anyio


async def _sources(client: Any) -> dict[str, int]:
    listing = (await client.post("/v1/dataprep/get")).json()
    return {item["name"]: item["chunks"] for item in listing}


async def test_ingest_list_and_search_an_uploaded_file(client_for: ClientFactory) -> None:
    client = await client_for()
    text = b"# Gardening\n\n## Tomatoes\nWater tomato seedlings every morning in July.\n"
    response = await client.post(
        "/v1/dataprep/ingest", files=[("files", ("garden.md", text, "text/markdown"))]
    )
    assert response.status_code == 200, response.text
    assert response.json()["files"] == [{"name": "garden.md", "status": "ingested", "chunks": 1}]
    assert (await _sources(client))["garden.md"] == 1
    answer = await client.post(
        "/v1/chatqna", json={"messages": "watering tomato seedlings", "stream": False}
    )
    assert answer.json()["metadata"]["source_documents"][0]["source"] == "garden.md"


async def test_reingest_replaces_chunks(client_for: ClientFactory) -> None:
    client = await client_for()
    first = b"# A\n\n## One\nalpha\n\n## Two\nbeta\n"
    second = b"# A\n\n## One\ngamma\n"
    for body in (first, second):
        await client.post("/v1/dataprep/ingest", files=[("files", ("a.md", body, "text/plain"))])
    assert (await _sources(client))["a.md"] == 1
    answer = await client.post("/v1/chatqna", json={"messages": "gamma", "stream": False})
    texts = [d["text"] for d in answer.json()["metadata"]["source_documents"]]
    assert "gamma" in texts and "alpha" not in texts


async def test_unsupported_file_type_is_415_and_changes_nothing(
    client_for: ClientFactory,
) -> None:
    client = await client_for()
    before = await _sources(client)
    response = await client.post(
        "/v1/dataprep/ingest",
        files=[
            ("files", ("ok.md", b"# ok\n\nfine text", "text/plain")),
            ("files", ("tool.exe", b"MZ\x00\x01", "application/octet-stream")),
        ],
    )
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_file_type"
    assert await _sources(client) == before


async def test_unreadable_and_missing_files(client_for: ClientFactory) -> None:
    client = await client_for()
    bad = await client.post(
        "/v1/dataprep/ingest", files=[("files", ("bad.txt", b"\xff\xfe\xfa", "text/plain"))]
    )
    assert bad.status_code == 422 and bad.json()["error"] == "document_unreadable"
    for form in ({"chunk_size": "500"}, {"link_list": "[]"}, {"link_list": ""}):
        none = await client.post("/v1/dataprep/ingest", data=form)
        assert none.status_code == 400 and none.json()["error"] == "invalid_request"
        assert "nothing to ingest" in none.json()["message"]
    for bad in ("not json", '{"url": "http://x"}', "[1, 2]", "[" * 100_000, '["http://a\\ud800"]'):
        links = await client.post("/v1/dataprep/ingest", data={"link_list": bad})
        assert links.status_code == 400 and links.json()["reason"] == "bad_link_list"


@pytest.mark.parametrize(
    ("page", "status"),
    [
        # A codec Python knows but no page is written in: ignored, the page read as UTF-8.
        (b'<meta charset="hex"><p>hex page</p>', 200),
        (b'<meta charset="idna"><p>idna page</p>', 200),
        # Ignored too, and the bytes are not UTF-8: the client's mistake, not a 500.
        (b'<meta charset="zlib"><p>caf\xe9</p>', 422),
    ],
)
async def test_an_html_charset_naming_no_text_encoding_is_never_a_500(
    client_for: ClientFactory, page: bytes, status: int
) -> None:
    client = await client_for()
    response = await client.post(
        "/v1/dataprep/ingest", files=[("files", ("page.html", page, "text/html"))]
    )
    assert response.status_code == status, response.text
    if status == 422:
        assert (response.json()["error"], response.json()["reason"]) == (
            "document_unreadable",
            "encoding",
        )
    else:
        assert (await _sources(client))["page.html"] == 1


@pytest.mark.parametrize("host", ["a" * 64 + ".example", "a..example"])
async def test_a_link_whose_host_no_resolver_takes_is_403_not_500(
    client_for: ClientFactory, host: str
) -> None:
    client = await client_for()  # the service's own fetcher and system resolver
    url = f"http://{host}/page.html"
    response = await client.post("/v1/dataprep/ingest", data={"link_list": json.dumps([url])})
    assert response.status_code == 403, response.text
    body = response.json()
    assert (body["error"], body["reason"]) == ("link_refused", "bad_url")
    assert body["details"] == {"url": url, "host": host}


async def test_a_link_with_credentials_is_refused_before_it_is_fetched(
    client_for: ClientFactory,
) -> None:
    client = await client_for()  # nothing answers wiki.test: a fetch would be a 422
    url = "http://alice:hunter2@wiki.test/page"
    response = await client.post("/v1/dataprep/ingest", data={"link_list": json.dumps([url])})
    assert response.status_code == 403, response.text
    body = response.json()
    assert (body["error"], body["reason"]) == ("link_refused", "bad_url")
    assert body["details"] == {"url": "http://wiki.test/page"}
    assert "hunter2" not in response.text


async def test_upload_size_limit(client_for: ClientFactory, settings: Settings) -> None:
    small = settings.model_copy(update={"chatqna_max_upload_bytes": 10})
    client = await client_for(await make_backends(small), small)
    response = await client.post(
        "/v1/dataprep/ingest", files=[("files", ("big.txt", b"x" * 11, "text/plain"))]
    )
    assert response.status_code == 413


async def test_delete_one_unknown_and_all(client_for: ClientFactory) -> None:
    client = await client_for()
    assert "export.md" in await _sources(client)
    deleted = await client.post("/v1/dataprep/delete", json={"file_path": "export.md"})
    assert deleted.status_code == 200 and deleted.json()["removed_chunks"] == 2
    assert "export.md" not in await _sources(client)
    missing = await client.post("/v1/dataprep/delete", json={"file_path": "nope.md"})
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    await client.post("/v1/dataprep/delete", json={"file_path": "all"})
    assert await _sources(client) == {}


async def test_a_request_beyond_its_chunk_budget_is_413_and_changes_nothing(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_dataprep_max_request_chunks": 2})
    client = await client_for(await make_backends(small), small)
    before = await _sources(client)
    files = [
        ("files", (f"n{i}.txt", b"Note %d about tomatoes." % i, "text/plain")) for i in range(3)
    ]
    response = await client.post("/v1/dataprep/ingest", files=files)
    assert response.status_code == 413
    body = response.json()
    assert (body["error"], body["reason"]) == ("payload_too_large", "request_too_large")
    assert "CHATQNA_DATAPREP_MAX_REQUEST_CHUNKS" in body["message"]
    assert body["details"] == {"source": "n2.txt", "count": 3, "limit": 2}
    assert await _sources(client) == before
    fits = await client.post("/v1/dataprep/ingest", files=files[:2])
    assert fits.status_code == 200, fits.text


async def test_a_one_character_stride_over_a_long_text_is_413_at_the_chunk_budget(
    client_for: ClientFactory, settings: Settings
) -> None:
    small = settings.model_copy(update={"chatqna_dataprep_max_request_chunks": 50})
    client = await client_for(await make_backends(small), small)
    before = await _sources(client)
    text = b"x" * 200_000  # a stride of one character: unbounded, some 200,000 chunks
    response = await client.post(
        "/v1/dataprep/ingest",
        files=[("files", ("big.txt", text, "text/plain"))],
        data={"chunk_size": "100", "chunk_overlap": "99"},
    )
    assert response.status_code == 413
    body = response.json()
    assert (body["error"], body["reason"]) == ("payload_too_large", "request_too_large")
    assert body["details"] == {"source": "big.txt", "count": 51, "limit": 50}
    assert await _sources(client) == before


async def test_a_form_with_more_files_than_the_form_limit_is_400(
    client_for: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chatqna import app

    monkeypatch.setattr(app, "MAX_FORM_FILES", 2)
    client = await client_for()
    before = await _sources(client)
    files = [("files", (f"n{i}.txt", b"Note %d." % i, "text/plain")) for i in range(3)]
    response = await client.post("/v1/dataprep/ingest", files=files)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert "Too many files" in response.json()["message"]
    assert await _sources(client) == before
    assert (await client.post("/v1/dataprep/ingest", files=files[:2])).status_code == 200
