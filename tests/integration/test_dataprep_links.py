"""`link_list` against real HTTP servers on loopback, fetched through the pinned connection.

The service under test runs in-process (ASGI) on fake model backends; the pages come from
an aiohttp server on 127.0.0.1. Names under `.test` resolve through a fake resolver, so a
"DNS name resolving to a private address" needs no real DNS; no connection ever leaves
loopback (refused addresses are refused before anything is contacted).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from aiohttp import web

from chatqna.api.dataprep import link_fetcher
from chatqna.app import create_app
from chatqna.ingest.links import LinkFetcher
from chatqna.settings import Settings
from tests.unit.api.conftest import make_backends
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

GUIDE = b"""<html><head><title>Lantern guide</title></head><body><nav>Menu</nav><main>
<h2>Night mode</h2><p>Lantern mode dims the map after sunset automatically.</p></main>
</body></html>"""
GUIDE_V2 = b"""<html><head><title>Lantern guide</title></head><body><main>
<h2>Night mode</h2><p>Lantern mode is now switched on by hand only.</p></main></body></html>"""


# path -> (body, the charset its Content-Type declares)
SERVED_TEXT = {
    "/latin.txt": (
        "Cr\u00e8me br\u00fbl\u00e9e at the Lantern caf\u00e9.".encode("latin-1"),
        "utf-8",
    ),
    "/wide.txt": (
        "Cr\u00e8me br\u00fbl\u00e9e at the Lantern caf\u00e9.".encode("utf-16-le"),
        "utf-16",
    ),
    "/escaped.txt": (b"Lantern +AGE- C:\\x41", "unicode_escape"),
}


class Pages:
    """An aiohttp server on 127.0.0.1 whose routes the tests steer."""

    def __init__(self) -> None:
        self.guide = GUIDE
        self.port = 0
        self.hits: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(request.path)
        if request.path == "/guide.html":
            return web.Response(body=self.guide, content_type="text/html")
        if request.path == "/prices.csv":
            return web.Response(body=b"Plan,Price\nLantern Pro,12 EUR\n", content_type="text/csv")
        if request.path in SERVED_TEXT:
            body, charset = SERVED_TEXT[request.path]
            headers = {"Content-Type": f"text/plain; charset={charset}"}
            return web.Response(body=body, headers=headers)
        if request.path == "/to-private":
            raise web.HTTPFound("http://10.255.0.1/admin")
        if request.path == "/to-loopback":
            raise web.HTTPFound(f"http://127.0.0.1:{self.port}/guide.html")
        if request.path == "/to-intranet":
            raise web.HTTPFound(f"http://intranet.test:{self.port}/guide.html")
        if request.path in ("/endless", "/slow"):
            response = web.StreamResponse(headers={"Content-Type": "text/html"})
            await response.prepare(request)
            while True:
                await response.write(b"<p>" + b"z" * 4096 + b"</p>")
                await asyncio.sleep(0.2 if request.path == "/slow" else 0)
        raise web.HTTPNotFound()


@pytest.fixture
async def pages() -> AsyncIterator[Pages]:
    server = Pages()
    runner = web.AppRunner(web.Application(handler_args=None))
    runner.app.router.add_route("GET", "/{tail:.*}", server.handle)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    yield server
    await runner.cleanup()


NAMES = {"pages.test": ["127.0.0.1"], "intranet.test": ["127.0.0.1"], "corp.test": ["10.1.1.1"]}


async def fake_resolver(host: str, port: int) -> list[str]:
    if host in NAMES:
        return NAMES[host]
    raise OSError(f"unknown host {host}")


async def service(tmp_path: Any, **overrides: Any) -> Any:
    settings = Settings(chatqna_data_dir=tmp_path / "data", **overrides)
    app = create_app(settings, await make_backends(settings), tracer_provider=TRACER_PROVIDER)
    app.dependency_overrides[link_fetcher] = lambda: LinkFetcher(settings, resolver=fake_resolver)
    return app


async def run(app: Any, *forms: dict[str, str]) -> list[Any]:
    out: list[Any] = []
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://localhost:8888"
        ) as client,
    ):
        for form in forms:
            if form == {}:
                listing = (await client.post("/v1/dataprep/get")).json()
                out.append({item["name"]: item["chunks"] for item in listing})
            elif "ask" in form:
                answer = await client.post(
                    "/v1/chatqna", json={"messages": form["ask"], "stream": False}
                )
                out.append(answer.json()["metadata"]["source_documents"][0])
            else:
                out.append(await client.post("/v1/dataprep/ingest", data=form, timeout=30))
    return out


def links(*urls: str) -> dict[str, str]:
    return {"link_list": json.dumps(list(urls))}


async def test_allow_listed_pages_are_ingested_and_replaced(pages: Pages, tmp_path: Any) -> None:
    app = await service(tmp_path, chatqna_dataprep_link_allowlist=["127.0.0.1"])
    guide = f"http://127.0.0.1:{pages.port}/guide.html"
    prices = f"http://127.0.0.1:{pages.port}/prices.csv"
    first, top, listing = await run(
        app, links(guide, prices), {"ask": "Lantern mode after sunset"}, {}
    )
    assert first.status_code == 200, first.text
    assert {f["name"]: f["status"] for f in first.json()["files"]} == {
        guide: "ingested",
        prices: "ingested",
    }
    assert (top["source"], top["title"]) == (guide, "Night mode")
    assert "Menu" not in top["text"]
    assert listing[guide] == 1 and listing[prices] == 1
    pages.guide = GUIDE_V2
    again, top = await run(app, links(guide), {"ask": "Lantern mode switched on by hand"})
    assert again.json()["files"] == [{"name": guide, "status": "ingested", "chunks": 1}]
    assert top["source"] == guide and "by hand" in top["text"]


@pytest.mark.parametrize(
    ("path", "host", "allow", "reason"),
    [
        ("/guide.html", "127.0.0.1", [], "loopback_address"),
        ("/guide.html", "corp.test", [], "private_address"),
        ("/to-private", "pages.test", ["pages.test"], "private_address"),
        ("/to-loopback", "pages.test", ["pages.test"], "loopback_address"),
    ],
)
async def test_refused_addresses_change_nothing(
    pages: Pages,
    tmp_path: Any,
    path: str,
    host: str,
    allow: list[str],
    reason: str,
) -> None:
    app = await service(tmp_path, chatqna_dataprep_link_allowlist=allow)
    url = f"http://{host}:{pages.port}{path}"
    before, refused, after = await run(app, {}, links(url), {})
    assert refused.status_code == 403, refused.text
    body = refused.json()
    assert body["error"] == "link_refused" and body["reason"] == reason
    assert body["details"]["url"] == url and url in body["message"]
    assert after == before
    assert "/guide.html" not in pages.hits  # the refused address was never contacted


async def test_a_name_resolving_to_loopback_is_fetched_once_allow_listed(
    pages: Pages, tmp_path: Any
) -> None:
    url = f"http://pages.test:{pages.port}/to-intranet"
    refused_app = await service(tmp_path / "a", chatqna_dataprep_link_allowlist=["pages.test"])
    (refused,) = await run(refused_app, links(url))
    assert refused.status_code == 403 and refused.json()["reason"] == "loopback_address"
    assert refused.json()["details"]["host"] == "intranet.test"
    allowed_app = await service(
        tmp_path / "b", chatqna_dataprep_link_allowlist=["pages.test", "intranet.test"]
    )
    (allowed,) = await run(allowed_app, links(url))
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["files"][0]["name"] == url


@pytest.mark.parametrize(
    ("path", "settings", "status", "error"),
    [
        ("/endless", {"chatqna_dataprep_link_max_bytes": 100_000}, 413, "payload_too_large"),
        ("/slow", {"chatqna_dataprep_link_timeout_seconds": 1.0}, 422, "link_unreadable"),
        ("/missing", {}, 422, "link_unreadable"),
    ],
)
async def test_links_that_never_end_or_fail_change_nothing(
    pages: Pages,
    tmp_path: Any,
    path: str,
    settings: dict[str, Any],
    status: int,
    error: str,
) -> None:
    app = await service(tmp_path, chatqna_dataprep_link_allowlist=["127.0.0.0/8"], **settings)
    good = f"http://127.0.0.1:{pages.port}/guide.html"
    bad = f"http://127.0.0.1:{pages.port}{path}"
    before, failed, after = await run(app, {}, links(good, bad), {})
    assert failed.status_code == status, failed.text
    assert failed.json()["error"] == error and failed.json()["details"]["url"] == bad
    assert after == before and good not in after


async def test_links_go_through_the_named_proxy_after_the_address_check(
    pages: Pages, tmp_path: Any
) -> None:
    # `pages` plays the forward proxy: an absolute-form request for a .test name arrives
    # there, and the proxy (not the service) resolves and connects.
    proxy = f"http://127.0.0.1:{pages.port}"
    app = await service(
        tmp_path,
        chatqna_dataprep_link_allowlist=["pages.test"],
        chatqna_dataprep_link_proxy=proxy,
    )
    good = "http://pages.test/guide.html"
    private = "http://corp.test/guide.html"
    refused, fetched, listing = await run(app, links(private), links(good), {})
    assert refused.status_code == 403 and refused.json()["reason"] == "private_address"
    assert fetched.status_code == 200, fetched.text
    assert listing[good] == 1 and private not in listing
    assert pages.hits == ["/guide.html"]  # only the allowed page reached the proxy


@pytest.mark.parametrize(
    ("files", "status"),
    [
        ([("tool.exe", b"MZ")], 415),
        ([("a.md", b"# A"), ("a.md", b"# A again")], 400),
    ],
)
async def test_a_bad_upload_fails_the_request_before_any_link_is_fetched(
    pages: Pages, tmp_path: Any, files: list[tuple[str, bytes]], status: int
) -> None:
    app = await service(tmp_path, chatqna_dataprep_link_allowlist=["127.0.0.1"])
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://localhost:8888"
        ) as client,
    ):
        response = await client.post(
            "/v1/dataprep/ingest",
            data=links(f"http://127.0.0.1:{pages.port}/guide.html"),
            files=[("files", item) for item in files],
        )
    assert response.status_code == status, response.text
    assert pages.hits == []


async def test_a_text_link_is_decoded_strictly_with_the_charset_it_declares(
    pages: Pages, tmp_path: Any
) -> None:
    app = await service(tmp_path, chatqna_dataprep_link_allowlist=["127.0.0.1"])
    base = f"http://127.0.0.1:{pages.port}"
    before, refused, after, wide, top, escaped, listing = await run(
        app,
        {},
        links(f"{base}/latin.txt"),
        {},
        links(f"{base}/wide.txt"),
        {"ask": "Cr\u00e8me br\u00fbl\u00e9e at the Lantern caf\u00e9"},
        links(f"{base}/escaped.txt"),
        {},
    )
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert (body["error"], body["reason"]) == ("document_unreadable", "encoding")
    assert "latin.txt" in body["message"] and after == before
    assert wide.status_code == 200, wide.text
    assert (top["source"], top["text"]) == (
        f"{base}/wide.txt",
        SERVED_TEXT["/wide.txt"][0].decode("utf-16-le"),
    )
    # unicode_escape is no Encoding Standard label: the bytes are read as UTF-8.
    assert escaped.status_code == 200, escaped.text
    assert listing[f"{base}/escaped.txt"] == 1
