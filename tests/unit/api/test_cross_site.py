"""`CrossSiteGuard` on its own: another site's write is refused with the envelope; reads,
this origin's writes, programs' writes and the listed sites' writes go through."""

from __future__ import annotations

import httpx2
import pytest
from starlette.types import Receive, Scope, Send

from chatqna.api.cross_site import CROSS_SITE_REFUSAL, CrossSiteGuard
from chatqna.api.origins import own_host_names

pytestmark = pytest.mark.anyio

LISTED = "https://admin.example.com"


async def accepted(scope: Scope, receive: Receive, send: Send) -> None:
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def guarded() -> httpx2.AsyncClient:
    app = CrossSiteGuard(accepted, allowed_origins=[LISTED])
    transport = httpx2.ASGITransport(app=app)
    return httpx2.AsyncClient(transport=transport, base_url="http://chat.internal:8888")


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "https://other.example.com"},
        {"Origin": "http://evil.example"},  # plain HTTP: no Sec-Fetch-Site
        {"Origin": "null"},
    ],
)
async def test_another_site_s_write_is_refused_with_403(headers: dict[str, str]) -> None:
    async with guarded() as client:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            response = await client.request(method, "/v1/dataprep/ingest", headers=headers)
            assert response.status_code == 403, (method, headers)
            assert response.json() == {"error": "cross_site_request", "message": CROSS_SITE_REFUSAL}


async def test_a_refused_form_closes_the_connection_its_body_would_otherwise_hold() -> None:
    async with guarded() as client:
        form = {"files": ("a.md", b"# A\n\nPlanted.", "text/markdown")}
        headers = {"Origin": "http://evil.example"}
        refused = await client.post("/v1/dataprep/ingest", files=form, headers=headers)
        assert refused.status_code == 403
        assert refused.headers["connection"] == "close"


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("GET", {"Sec-Fetch-Site": "cross-site"}),  # a read changes nothing
        ("HEAD", {"Origin": "http://evil.example"}),
        ("OPTIONS", {"Origin": "http://evil.example"}),  # a preflight
        ("POST", {}),  # a program
        ("POST", {"Sec-Fetch-Site": "same-origin"}),
        ("POST", {"Sec-Fetch-Site": "none"}),
        ("POST", {"Origin": "http://chat.internal:8888"}),
        ("POST", {"Origin": LISTED, "Sec-Fetch-Site": "cross-site"}),
        ("POST", {"Origin": LISTED}),
        # A program with a key that forwards a browser's headers, or an extension: no
        # browser adds a Bearer token itself, and a page must pass a preflight to set one.
        ("POST", {"Origin": "chrome-extension://abcdef", "Authorization": "Bearer k"}),
        ("POST", {"Sec-Fetch-Site": "cross-site", "Authorization": "bearer k"}),
    ],
)
async def test_reads_own_writes_programs_and_listed_sites_pass(
    method: str, headers: dict[str, str]
) -> None:
    async with guarded() as client:
        response = await client.request(method, "/v1/dataprep/ingest", headers=headers)
        assert response.status_code == 204, (method, headers)


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://chat.example.com", 204),  # the proxy's public name
        ("http://chat.example.com:8080", 204),
        ("http://other.example.com", 403),  # a wildcard names no origin
        ("https://chat.example.com", 403),  # another scheme
        ("http://evil.example", 403),
    ],
)
async def test_a_write_from_a_listed_public_name_passes_behind_a_proxy_that_rewrites_host(
    origin: str, status: int
) -> None:
    app = CrossSiteGuard(
        accepted,
        allowed_origins=[],
        own_hosts=own_host_names(["chat.example.com", "*.example.com"]),
    )
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://backend:8888") as client:
        response = await client.post("/v1/dataprep/ingest", headers={"Origin": origin})
        assert response.status_code == status, origin
