"""The API key over every route of both app roles, and CORS.

With `CHATQNA_API_KEY` set, each route the app serves (read from `app.routes`, so a route
added later is covered without editing this file) refuses a request without the key or
with a wrong one, and lets it through with the key, as Bearer or as the password of Basic
credentials. Only the health checks are open; the chat UI's page and files challenge Basic,
so a browser asks for the key.
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
    settings: Settings, role: Role
) -> AsyncIterator[tuple[FastAPI, httpx2.AsyncClient]]:
    backends = await make_backends(settings)
    if role == "retriever":
        backends.reranker = None
    app = create_app(settings, backends, tracer_provider=TRACER_PROVIDER, role=role)
    async with app.router.lifespan_context(app):
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(
            transport=transport, base_url="http://chatqna.test"
        ) as client:
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
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr(KEY)})
    async for app, client in running(locked, role):
        checked = operations(app)
        templates = {template for _, _, template in checked}
        assert templates >= HEALTH
        assert {"/openapi.json", "/docs", "/metrics", "/v1/dataprep/ingest"} <= templates
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


async def test_basic_credentials_authorise_a_write_only_from_this_origin(
    settings: Settings,
) -> None:
    """A browser sends its cached sign-in with a form another site posts here, so a write
    with Basic needs the browser to say this origin started it; Bearer is never automatic."""
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr(KEY)})
    async for _, client in running(locked, "megaservice"):
        ask = {"messages": "How do I export my data?", "stream": False}
        chat = partial(client.post, "/v1/chatqna", json=ask)

        for site in ("cross-site", "same-site"):
            forged = await chat(headers={**SIGNED_IN, "Sec-Fetch-Site": site})
            assert forged.status_code == 401, site
            assert forged.headers["www-authenticate"] == "Bearer"
            assert (await chat(headers={**GOOD, "Sec-Fetch-Site": site})).status_code == 200, site
            # Reading stays open to a signed-in browser: it changes nothing, and another
            # site cannot read the answer without CORS.
            read = await client.get("/v1/models", headers={**SIGNED_IN, "Sec-Fetch-Site": site})
            assert read.status_code == 200, site
        for site in ("same-origin", "none"):
            assert (await chat(headers={**SIGNED_IN, "Sec-Fetch-Site": site})).status_code == 200, (
                site
            )
        upload = {"files": ("a.md", b"# A\n\nText.", "text/markdown")}
        forged = await client.post(
            "/v1/dataprep/ingest",
            files=upload,
            headers={**SIGNED_IN, "Sec-Fetch-Site": "cross-site"},
        )
        assert forged.status_code == 401
        own = await client.post(
            "/v1/dataprep/ingest",
            files=upload,
            headers={**SIGNED_IN, "Sec-Fetch-Site": "same-origin"},
        )
        assert own.status_code == 200


async def test_a_page_a_person_opens_asks_the_browser_for_the_key(settings: Settings) -> None:
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr(KEY)})
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
