"""The API key over every route of both app roles, another site's writes, and CORS.

With `CHATQNA_API_KEY` set, each route the app serves (read from `app.routes`, so a route
added later is covered without editing this file) refuses a request without the key or
with a wrong one, and lets it through with the key, as Bearer or as the password of Basic
credentials. Only the health checks are open; the chat UI's page and files challenge Basic,
so a browser asks for the key. With a key or without, a write another site's page started
is refused (403), told by `Sec-Fetch-Site` or, over plain HTTP, by `Origin`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from functools import partial
from typing import Literal

import httpx2
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from pydantic import SecretStr

from chatqna.api.guards import is_public
from chatqna.app import create_app
from chatqna.settings import Settings
from tests.unit.api.conftest import make_backends
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

KEY = "k-7c1e2b9d4f"
GOOD = {"Authorization": f"Bearer {KEY}"}
HEALTH = {"/v1/health_check", "/v1/ready"}
UI = {"/", "/ui/{name}"}
API_REFUSAL = "A valid API key is required: send 'Authorization: Bearer <key>'."
UI_REFUSAL = "A valid API key is required: sign in with any user name and the key as the password."
BASIC_CHALLENGE = 'Basic realm="ChatQnA", charset="UTF-8"'
Role = Literal["megaservice", "retriever"]


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


SIGNED_IN = basic("anyone", KEY)


async def running(
    settings: Settings, role: Role, base_url: str = "http://localhost:8888"
) -> AsyncIterator[tuple[FastAPI, httpx2.AsyncClient]]:
    backends = await make_backends(settings)
    if role == "retriever":
        backends.reranker = None
    app = create_app(settings, backends, tracer_provider=TRACER_PROVIDER, role=role)
    async with app.router.lifespan_context(app):
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url=base_url) as client:
            yield app, client


def operations(app: FastAPI) -> list[tuple[str, str, str]]:
    """(method, concrete path, route template) for every method of every route.

    `iter_route_contexts` flattens the routers `include_router` added (FastAPI keeps each
    as one entry of `app.routes`). A UI file is one that exists, so a keyed request gets it.
    """
    found = []
    for route in iter_route_contexts(app.routes):
        template = str(route.path)
        path = template.replace("/ui/{name}", "/ui/app.js")
        path = re.sub(r"\{[^}]+\}", "x", path)
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            found.append((method, path, template))
    return found


@pytest.mark.parametrize("role", ["megaservice", "retriever"])
async def test_every_route_but_health_needs_the_key(settings: Settings, role: Role) -> None:
    update = {"chatqna_api_key": SecretStr(KEY), "chatqna_api_docs": True}
    locked = settings.model_copy(update=update)
    async for app, client in running(locked, role):
        checked = operations(app)
        templates = {template for _, _, template in checked}
        assert templates >= HEALTH
        assert {"/openapi.json", "/docs", "/redoc", "/metrics", "/v1/dataprep/ingest"} <= templates
        assert ("/v1/chatqna" in templates) is (role == "megaservice")
        assert ("/v1/retrieval" in templates) is (role == "retriever")
        assert (templates >= UI) is (role == "megaservice")
        assert {template for template in templates if is_public(template)} == HEALTH

        for method, path, template in checked:
            anonymous = await client.request(method, path)
            if template in HEALTH:
                assert anonymous.status_code == 200, (method, path)
                continue
            wrong = await client.request(method, path, headers={"Authorization": f"Bearer {KEY}x"})
            wrong_password = await client.request(method, path, headers=basic(KEY, f"{KEY}x"))
            for refused in (anonymous, wrong, wrong_password):
                assert refused.status_code == 401, (method, path)
                if template in UI:
                    challenge, message = BASIC_CHALLENGE, UI_REFUSAL
                else:
                    challenge, message = "Bearer", API_REFUSAL
                assert refused.headers["www-authenticate"] == challenge, (method, path)
                if method != "HEAD":
                    assert refused.json() == {"error": "unauthorized", "message": message}
            for credentials in (GOOD, SIGNED_IN):
                keyed = await client.request(method, path, headers=credentials)
                assert keyed.status_code != 401, (method, path, credentials)
                if template in UI:
                    assert keyed.status_code == 200, (method, path)


async def test_the_key_lets_a_chat_through_and_unknown_paths_reveal_nothing(
    settings: Settings,
) -> None:
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr(KEY)})
    async for _, client in running(locked, "megaservice"):
        ask = {"messages": "How do I export my data?", "stream": False}
        assert (await client.post("/v1/chatqna", json=ask, headers=GOOD)).status_code == 200
        lower = {"Authorization": f"bearer {KEY}"}
        assert (await client.post("/v1/chatqna", json=ask, headers=lower)).status_code == 200
        nameless = basic("", KEY)
        assert (await client.post("/v1/chatqna", json=ask, headers=nameless)).status_code == 200
        # Without the key, a path that does not exist looks like any other guarded path.
        assert (await client.get("/v1/no-such-thing")).status_code == 401
        assert (await client.get("/v1/no-such-thing", headers=GOOD)).status_code == 404
        assert (await client.get("/v1/no-such-thing", headers=SIGNED_IN)).status_code == 404
        key_only = base64.b64encode(KEY.encode()).decode()
        for header in (
            f"Basic {KEY}",  # not base64
            f"Basic {key_only}",  # no user name part
            basic(KEY, "")["Authorization"],  # the key as the user name
            f"Digest {key_only}",
            KEY,
            "Bearer",
            f"Bearer {KEY[:-1]}",
        ):
            response = await client.get("/v1/models", headers={"Authorization": header})
            assert response.status_code == 401, header


CHAT = {"messages": "How do I export my data?", "stream": False}
UPLOAD = {"files": ("planted.md", b"# Planted\n\nText another site chose.", "text/markdown")}
LISTED = "https://admin.example.com"


async def ingested(client: httpx2.AsyncClient) -> set[str]:
    listed = await client.post("/v1/dataprep/get", headers=GOOD)
    return {entry["name"] for entry in listed.json()}


async def test_basic_credentials_authorise_a_write_only_from_this_origin(
    settings: Settings,
) -> None:
    """A browser sends its cached sign-in with a request another site's page starts; a
    write with Basic needs the browser to say this origin started it (`Sec-Fetch-Site`),
    or, over plain HTTP where it sends no such header, an `Origin` that is this one. That
    holds for the sites CORS lets through too: their pages call with Bearer."""
    locked = settings.model_copy(
        update={
            "chatqna_api_key": SecretStr(KEY),
            "chatqna_cors_origins": [LISTED],
            "chatqna_host": "0.0.0.0",
        }
    )
    async for _, client in running(locked, "megaservice", "http://chatqna.internal:8888"):
        chat = partial(client.post, "/v1/chatqna", json=CHAT)
        own = "http://chatqna.internal:8888"
        for browser in ({"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}, {}):
            signed_in = {**SIGNED_IN, **browser}
            assert (await chat(headers=signed_in)).status_code == 200, browser
        # Plain HTTP to a host that is not localhost: the browser sends Origin alone.
        assert (await chat(headers={**SIGNED_IN, "Origin": own})).status_code == 200
        upload = await client.post(
            "/v1/dataprep/ingest", files=UPLOAD, headers={**SIGNED_IN, "Origin": own}
        )
        assert upload.status_code == 200
        for listed in ({"Origin": LISTED}, {"Origin": LISTED, "Sec-Fetch-Site": "cross-site"}):
            forged = await chat(headers={**SIGNED_IN, **listed})
            assert forged.status_code == 401, listed
            assert forged.headers["www-authenticate"] == "Bearer"
            assert (await chat(headers={**GOOD, **listed})).status_code == 200, listed
        # A program holding the key may forward a browser's Origin: the key still decides.
        extension = {**GOOD, "Origin": "chrome-extension://abcdef"}
        assert (await chat(headers=extension)).status_code == 200
        wrong = {"Authorization": f"Bearer {KEY}x", "Origin": "chrome-extension://abcdef"}
        assert (await chat(headers=wrong)).status_code == 401
        # Reading stays open to a signed-in browser: it changes nothing, and another site
        # cannot read the answer without CORS.
        for site in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"}):
            read = await client.get("/v1/models", headers={**SIGNED_IN, **site})
            assert read.status_code == 200, site


async def test_behind_a_proxy_that_rewrites_host_the_listed_public_name_is_this_origin(
    settings: Settings,
) -> None:
    """nginx's `proxy_pass http://backend:8888` without passing `Host` on: the browser's
    writes carry `Origin: http://chat.example.com` to a request for `backend:8888`. With
    the public name in `CHATQNA_ALLOWED_HOSTS`, they are this origin's own, for the
    cross-site guard and for the browser's Basic sign-in; no other site's are."""
    proxied = settings.model_copy(
        update={
            "chatqna_api_key": SecretStr(KEY),
            "chatqna_host": "0.0.0.0",
            "chatqna_allowed_hosts": ["chat.example.com", "backend", "*.example.com"],
            "chatqna_cors_origins": [LISTED],
        }
    )
    async for _, client in running(proxied, "megaservice", "http://backend:8888"):
        public = {**SIGNED_IN, "Origin": "http://chat.example.com"}
        assert (await client.post("/v1/chatqna", json=CHAT, headers=public)).status_code == 200
        upload = await client.post("/v1/dataprep/ingest", files=UPLOAD, headers=public)
        assert upload.status_code == 200
        assert "planted.md" in await ingested(client)
        for other in ("http://evil.example", "http://other.example.com", "http://localhost:3000"):
            forged = await client.post(
                "/v1/dataprep/ingest", files=UPLOAD, headers={**SIGNED_IN, "Origin": other}
            )
            assert forged.status_code == 403, other
            assert forged.json()["error"] == "cross_site_request"
        # A site CORS lets through is not this origin: its pages call with Bearer.
        listed = await client.post(
            "/v1/chatqna", json=CHAT, headers={**SIGNED_IN, "Origin": LISTED}
        )
        assert listed.status_code == 401


@pytest.mark.parametrize("key", [None, KEY])
async def test_another_site_s_write_is_refused_with_or_without_a_key(
    settings: Settings, key: str | None
) -> None:
    """Another site's form (multipart, so no CORS preflight) must not plant a document,
    whether the service is open (the loopback default) or the browser holds a sign-in."""
    update: dict[str, object] = {"chatqna_host": "0.0.0.0", "chatqna_cors_origins": [LISTED]}
    if key is not None:
        update["chatqna_api_key"] = SecretStr(key)
    configured = settings.model_copy(update=update)
    async for _, client in running(configured, "megaservice", "http://chatqna.internal:8888"):
        before = await ingested(client)
        credentials = {} if key is None else SIGNED_IN
        for browser in (
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site", "Origin": "http://other.chatqna.internal"},
            {"Origin": "http://evil.example"},  # plain HTTP: no Sec-Fetch-Site
            {"Origin": "null"},  # a sandboxed frame
        ):
            headers = {**credentials, **browser}
            forged = await client.post("/v1/dataprep/ingest", files=UPLOAD, headers=headers)
            assert forged.status_code == 403, browser
            assert forged.json()["error"] == "cross_site_request"
            # A Bearer token is never a browser's own doing (a page that sets one passes a
            # CORS preflight first), so a request carrying one is left to the key check.
            chat = await client.post("/v1/chatqna", json=CHAT, headers={**GOOD, **browser})
            assert chat.status_code == 200, browser
        assert await ingested(client) == before
        # The sites CORS lets through may write, as their pages call with Bearer.
        for listed in ({"Origin": LISTED}, {"Origin": LISTED, "Sec-Fetch-Site": "cross-site"}):
            chat = await client.post("/v1/chatqna", json=CHAT, headers={**GOOD, **listed})
            assert chat.status_code == 200, listed
            assert chat.headers["access-control-allow-origin"] == LISTED
        # A program sends neither header, and writes as before.
        program = await client.post("/v1/dataprep/ingest", files=UPLOAD, headers=GOOD)
        assert program.status_code == 200
        assert await ingested(client) == before | {"planted.md"}


async def test_a_page_a_person_opens_asks_the_browser_for_the_key(settings: Settings) -> None:
    locked = settings.model_copy(
        update={"chatqna_api_key": SecretStr(KEY), "chatqna_api_docs": True}
    )
    async for _, client in running(locked, "megaservice"):
        navigate = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "none"}
        for path in ("/", "/docs", "/metrics"):
            opened = await client.get(path, headers=navigate)
            assert opened.status_code == 401, path
            assert opened.headers["www-authenticate"] == BASIC_CHALLENGE, path
            assert (await client.get(path, headers={**navigate, **SIGNED_IN})).status_code == 200
        # A script's call, or a write, never makes the browser prompt.
        fetched = await client.get("/v1/models", headers={"Sec-Fetch-Mode": "cors"})
        assert fetched.headers["www-authenticate"] == "Bearer"
        posted = await client.post("/v1/chatqna", json={}, headers=navigate)
        assert posted.status_code == 401 and posted.headers["www-authenticate"] == "Bearer"


async def test_without_a_key_nothing_is_guarded(settings: Settings) -> None:
    async for _, client in running(settings, "megaservice"):
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/openapi.json")).status_code == 200


# --------------------------------------------------------------------------- CORS

ORIGIN = "https://chat.example.com"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def test_cors_is_off_by_default(settings: Settings) -> None:
    async for _, client in running(settings, "megaservice"):
        response = await client.get("/v1/models", headers={"Origin": ORIGIN})
        assert response.status_code == 200
        assert "access-control-allow-origin" not in response.headers
        preflight = await client.options("/v1/chatqna", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in preflight.headers


async def test_cors_allows_the_listed_origins_before_the_key_check(settings: Settings) -> None:
    opened = settings.model_copy(
        update={
            "chatqna_api_key": SecretStr(KEY),
            "chatqna_cors_origins": [ORIGIN, "https://admin.example.com"],
        }
    )
    async for _, client in running(opened, "megaservice"):
        preflight = await client.options("/v1/chatqna", headers=PREFLIGHT)  # carries no key
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        # A refusal still carries the CORS headers, so the page can read why.
        refused = await client.get("/v1/models", headers={"Origin": ORIGIN})
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == ORIGIN
        served = await client.get("/v1/models", headers={"Origin": ORIGIN, **GOOD})
        assert served.status_code == 200
        assert "x-trace-id" in served.headers["access-control-expose-headers"].lower()
        stranger = await client.get(
            "/v1/models", headers={"Origin": "https://evil.example", **GOOD}
        )
        assert "access-control-allow-origin" not in stranger.headers


def test_cors_origins_are_one_comma_separated_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATQNA_CORS_ORIGINS", f"{ORIGIN}, https://admin.example.com ,")
    assert Settings().chatqna_cors_origins == [ORIGIN, "https://admin.example.com"]
    monkeypatch.setenv("CHATQNA_CORS_ORIGINS", "")
    assert Settings().chatqna_cors_origins == []
