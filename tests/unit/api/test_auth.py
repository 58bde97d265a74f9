"""The API key over every route of both app roles, and CORS.

With `CHATQNA_API_KEY` set, each route the app serves (read from `app.routes`, so a route
added later is covered without editing this file) refuses a request without the key or
with a wrong one, and lets it through with the key. Only the health checks and the chat
UI's page and static files are open.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Literal

import httpx
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
Role = Literal["megaservice", "retriever"]


async def running(
    settings: Settings, role: Role
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    backends = await make_backends(settings)
    if role == "retriever":
        backends.reranker = None
    app = create_app(settings, backends, tracer_provider=TRACER_PROVIDER, role=role)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://chatqna.test") as client:
            yield app, client


def operations(app: FastAPI) -> list[tuple[str, str, str]]:
    """(method, concrete path, route template) for every method of every route.

    `iter_route_contexts` flattens the routers `include_router` added (FastAPI keeps each
    as one entry of `app.routes`).
    """
    found = []
    for route in iter_route_contexts(app.routes):
        template = str(route.path)
        path = re.sub(r"\{[^}]+\}", "x", template)
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            found.append((method, path, template))
    return found


@pytest.mark.parametrize("role", ["megaservice", "retriever"])
async def test_every_route_but_health_and_ui_files_needs_the_key(
    settings: Settings, role: Role
) -> None:
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr(KEY)})
    async for app, client in running(locked, role):
        checked = operations(app)
        templates = {template for _, _, template in checked}
        assert templates >= HEALTH
        assert {"/openapi.json", "/docs", "/metrics", "/v1/dataprep/ingest"} <= templates
        assert ("/v1/chatqna" in templates) is (role == "megaservice")
        assert ("/v1/retrieval" in templates) is (role == "retriever")
        public = {template for template in templates if is_public(template)}
        assert public <= HEALTH | UI

        for method, path, template in checked:
            anonymous = await client.request(method, path)
            wrong = await client.request(method, path, headers={"Authorization": f"Bearer {KEY}x"})
            keyed = await client.request(method, path, headers=GOOD)
            assert keyed.status_code != 401, (method, path)
            if template in public:
                assert anonymous.status_code != 401, (method, path)
                continue
            for refused in (anonymous, wrong):
                assert refused.status_code == 401, (method, path)
                assert refused.headers["www-authenticate"] == "Bearer"
                if method != "HEAD":
                    assert refused.json() == {
                        "error": "unauthorized",
                        "message": "A valid API key is required: "
                        "send 'Authorization: Bearer <key>'.",
                    }


async def test_the_key_lets_a_chat_through_and_unknown_paths_reveal_nothing(
    settings: Settings,
) -> None:
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr(KEY)})
    async for _, client in running(locked, "megaservice"):
        ask = {"messages": "How do I export my data?", "stream": False}
        assert (await client.post("/v1/chatqna", json=ask, headers=GOOD)).status_code == 200
        lower = {"Authorization": f"bearer {KEY}"}
        assert (await client.post("/v1/chatqna", json=ask, headers=lower)).status_code == 200
        # Without the key, a path that does not exist looks like any other guarded path.
        assert (await client.get("/v1/no-such-thing")).status_code == 401
        assert (await client.get("/v1/no-such-thing", headers=GOOD)).status_code == 404
        for header in (f"Basic {KEY}", KEY, "Bearer", f"Bearer {KEY[:-1]}"):
            response = await client.get("/v1/models", headers={"Authorization": header})
            assert response.status_code == 401, header


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
