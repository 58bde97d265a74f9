"""The chat UI is served at `/` with its files under `/ui/`; with an API key, the browser asks
for it."""

from __future__ import annotations

import base64
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import httpx2
import pytest
from pydantic import SecretStr

from chatqna.app import create_app
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]
UI_DIR = REPO / "chatqna" / "ui"
TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def referenced_files() -> set[str]:
    """Every `ui/<name>` the page links and every module the scripts import."""
    page = (UI_DIR / "index.html").read_text()
    names = set(re.findall(r'(?:src|href)="ui/([^"]+)"', page))
    for script in UI_DIR.glob("*.js"):
        names |= set(re.findall(r'from "\./([^"]+)"', script.read_text()))
    return names


async def test_the_page_is_served_at_the_root(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="ui/app.js"></script>' in response.text
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["etag"].startswith('"')
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    head = await client.head("/")
    assert head.status_code == 200 and head.content == b""


async def test_every_referenced_file_loads_with_its_content_type(
    client_for: ClientFactory,
) -> None:
    client = await client_for()
    names = referenced_files()
    assert {"app.js", "api.js", "render.js", "sse.js", "chat.css", "icon.svg"} <= names
    for name in sorted(names):
        response = await client.get(f"/ui/{name}")
        assert response.status_code == 200, name
        assert response.headers["content-type"] == TYPES[Path(name).suffix], name
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.content == (UI_DIR / name).read_bytes()


async def test_an_unchanged_file_revalidates_to_304(client_for: ClientFactory) -> None:
    client = await client_for()
    first = await client.get("/ui/app.js")
    tag = first.headers["etag"]
    again = await client.get("/ui/app.js", headers={"If-None-Match": f'W/"x", {tag}'})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == tag
    other = await client.get("/ui/app.js", headers={"If-None-Match": '"stale"'})
    assert other.status_code == 200 and other.content == first.content


@pytest.mark.parametrize(
    "path", ["/ui/missing.js", "/ui/index.html", "/ui/__init__.py", "/ui/..%2Fapp.py", "/ui/"]
)
async def test_only_the_ui_files_are_served(client_for: ClientFactory, path: str) -> None:
    client = await client_for()
    response = await client.get(path)
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


async def test_with_a_key_the_browser_signs_in_for_the_page_and_its_calls(
    client_for: ClientFactory, settings: Settings
) -> None:
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr("s3cret")})
    client = await client_for(await make_backends(locked), locked)
    challenge = 'Basic realm="ChatQnA", charset="UTF-8"'
    for path in ["/", *(f"/ui/{name}" for name in sorted(referenced_files()))]:
        refused = await client.get(path)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == challenge, path
    # What the browser sends once the user has typed the key into its prompt.
    token = base64.b64encode(b"me:s3cret").decode()
    signed_in = {"Authorization": f"Basic {token}", "Sec-Fetch-Site": "same-origin"}
    page = await client.get("/", headers=signed_in)
    assert page.status_code == 200 and "ui/app.js" in page.text
    for name in referenced_files():
        assert (await client.get(f"/ui/{name}", headers=signed_in)).status_code == 200, name
    # The page's own calls carry the same sign-in, and a write from the page is accepted.
    assert (await client.get("/v1/models", headers=signed_in)).status_code == 200
    ask = {"messages": "hi", "stream": False}
    assert (await client.post("/v1/chatqna", json=ask, headers=signed_in)).status_code == 200
    # An API call without it is refused with a Bearer challenge: no dialog for a script.
    refused = await client.post("/v1/chatqna", json=ask)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    # The key panel's Bearer header works for the page as for any client.
    bearer = {"Authorization": "Bearer s3cret"}
    assert (await client.get("/", headers=bearer)).status_code == 200


async def test_the_retriever_role_serves_no_ui(settings: Settings) -> None:
    backends = await make_backends(settings)
    app = create_app(settings, backends, tracer_provider=TRACER_PROVIDER, role="retriever")
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://localhost:7000"
    ) as client:
        assert (await client.get("/")).status_code == 404
        assert (await client.get("/ui/app.js")).status_code == 404


def test_the_wheel_carries_every_ui_file() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["chatqna"]
    files = [p for p in UI_DIR.iterdir() if p.is_file() and p.suffix != ".py"]
    assert files
    missing = [p.name for p in files if not any(fnmatch(f"ui/{p.name}", g) for g in patterns)]
    assert missing == []
