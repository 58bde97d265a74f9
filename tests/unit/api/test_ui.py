"""The chat UI is served at `/` with its files under `/ui/`; under a root path its URLs stay
under the prefix; with an API key, the browser asks for it."""

from __future__ import annotations

import base64
import contextlib
import html
import re
import tomllib
from collections.abc import AsyncIterator
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urljoin

import httpx2
import pytest
from pydantic import SecretStr
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

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
    """Every `${base}ui/<name>` the page's template links and every module the scripts
    import."""
    page = (UI_DIR / "index.html").read_text()
    names = set(re.findall(r'(?:src|href)="\$\{base\}ui/([^"]+)"', page))
    for script in UI_DIR.glob("*.js"):
        names |= set(re.findall(r'from "\./([^"]+)"', script.read_text()))
    return names


async def test_the_page_is_served_at_the_root(client_for: ClientFactory) -> None:
    client = await client_for()
    response = await client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    # Without a root path the page's URLs are relative to it, as they always were.
    assert '<script type="module" src="ui/app.js"></script>' in response.text
    assert '<meta name="chatqna-base" content="">' in response.text
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


def behind_stripping_proxy(app: ASGIApp, prefix: str) -> ASGIApp:
    """`app` as a browser reaches it through a proxy that serves it under `prefix` and strips
    the prefix (`/chat` and `/chat/` both become `/`), run by uvicorn with `root_path=prefix`
    (which puts the prefix back in front of `path`). Other paths are not the app's: 404."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path: str = scope["path"]
        if path != prefix and not path.startswith(prefix + "/"):
            await Response(status_code=404)(scope, receive, send)
            return
        served = prefix + (path.removeprefix(prefix) or "/")
        scope = {**scope, "root_path": prefix, "path": served, "raw_path": served.encode()}
        await app(scope, receive, send)

    return asgi


def page_urls(page: str) -> list[str]:
    """The page's links, then the API paths its script calls after its `chatqna-base`, as
    `api.js` builds them."""
    links = re.findall(r'(?:src|href)="([^"#][^"]*)"', page)
    base = re.findall(r'<meta name="chatqna-base" content="([^"]*)">', page)
    assert len(base) == 1, "the page names the base of its API calls"
    api = [html.unescape(base[0]) + path for path in ("v1/models", "v1/chatqna")]
    return [html.unescape(link) for link in links] + api


@contextlib.asynccontextmanager
async def served_under(settings: Settings, prefix: str) -> AsyncIterator[httpx2.AsyncClient]:
    """A client on the app run with `CHATQNA_ROOT_PATH=prefix` behind a stripping proxy."""
    rooted = settings.model_copy(update={"chatqna_root_path": prefix})
    app = create_app(rooted, await make_backends(rooted), tracer_provider=TRACER_PROVIDER)
    transport = httpx2.ASGITransport(app=behind_stripping_proxy(app, prefix))
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=transport, base_url="http://localhost") as client,
    ):
        yield client


@pytest.mark.parametrize("opened_at", ["/chat/", "/chat"])
async def test_under_a_root_path_every_url_stays_under_the_prefix(
    settings: Settings, client_for: ClientFactory, opened_at: str
) -> None:
    async with served_under(settings, "/chat") as client:
        page = await client.get(opened_at)
        assert page.status_code == 200
        assert '<script type="module" src="/chat/ui/app.js"></script>' in page.text
        # Resolved as the browser does, against the page's URL with or without its slash.
        urls = [urljoin(f"http://localhost{opened_at}", url) for url in page_urls(page.text)]
        assert [url for url in urls if not url.startswith("http://localhost/chat/")] == []
        assert "http://localhost/chat/v1/chatqna" in urls
        for url in urls:
            if not url.endswith("/v1/chatqna"):  # a POST, which the chat tests make
                assert (await client.get(url)).status_code == 200, url
        again = await client.get(opened_at, headers={"If-None-Match": page.headers["etag"]})
        assert again.status_code == 304
    # The tag is the rendered page's, so a page cached under another root path is replaced.
    unrooted = await (await client_for()).get("/")
    assert page.headers["etag"] != unrooted.headers["etag"]


async def test_a_root_path_is_quoted_and_escaped_in_the_page(settings: Settings) -> None:
    async with served_under(settings, '/a&b"<c>') as client:
        page = (await client.get('/a&b"<c>')).text
    assert '<meta name="chatqna-base" content="/a%26b%22%3Cc%3E/">' in page
    assert '<script type="module" src="/a%26b%22%3Cc%3E/ui/app.js"></script>' in page
    assert "<c>" not in page


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
