"""The chat UI: `GET /` serves the page, `GET /ui/<name>` its static files.

With `CHATQNA_API_KEY` set they need the key like every other path; their refusal challenges
HTTP Basic (`chatqna.api.guards`), so the browser asks for the key (any user name, the key as
password) and resends it with the page's own API calls. The page's key panel is a fallback
for a key that stops working while the page is open.

The files are package data read once per process. Their names carry no content hash (there
is no build step), so responses say `Cache-Control: no-cache` with a strong `ETag`: a browser
revalidates on each load and gets an empty 304 while nothing changed.

The page is a template: its links and its API calls start with the root path the server runs
under (`CHATQNA_ROOT_PATH`, the ASGI scope's `root_path`), so behind a proxy that strips
`/chat` they stay under it whether the browser shows `/chat/` or `/chat`. Without a root path
they are relative to the page: right at `/`, and behind a stripping proxy left unconfigured
only while the page's URL ends with `/`.
"""

from __future__ import annotations

import hashlib
import html
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from string import Template
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response

from chatqna.errors import NotFound

router = APIRouter(tags=["ui"], include_in_schema=False)

PAGE = "index.html"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Everything the page needs comes from this origin; no inline script or style is allowed,
# so injected markup could not run even if some text slipped past `textContent`.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
COMMON_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
PAGE_HEADERS = {
    **COMMON_HEADERS,
    "Content-Security-Policy": PAGE_POLICY,
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True)
class Asset:
    """One static file: its bytes, content type and entity tag."""

    body: bytes
    content_type: str
    etag: str

    @classmethod
    def of(cls, body: bytes, content_type: str) -> Asset:
        """`body` with its tag: a strong ETag from its SHA-256."""
        return cls(body, content_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')


@cache
def assets() -> dict[str, Asset]:
    """Every servable file of `chatqna.ui`, by name (read once; package data is immutable)."""
    table = {}
    for entry in resources.files("chatqna.ui").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in CONTENT_TYPES:
            table[entry.name] = Asset.of(entry.read_bytes(), CONTENT_TYPES[suffix])
    return table


def url_base(root_path: str) -> str:
    """What the page's URLs start with: `/chat/` under the root path `/chat`, else nothing
    (relative URLs). The root path is decoded in the ASGI scope, hence the quoting."""
    return quote(root_path, safe="/") + "/" if root_path else ""


# A root path is the server's setting, so one or two per process; the bound is a backstop.
@lru_cache(maxsize=8)
def rendered_page(root_path: str) -> Asset:
    """The page with its links and its `chatqna-base` meta tag under `root_path`."""
    template = Template(assets()[PAGE].body.decode())
    body = template.substitute(base=html.escape(url_base(root_path)))
    return Asset.of(body.encode(), CONTENT_TYPES[".html"])


def _not_modified(request: Request, etag: str) -> bool:
    header = request.headers.get("if-none-match")
    if header is None:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    return etag in tags or "*" in tags


def _serve(asset: Asset, request: Request, headers: dict[str, str]) -> Response:
    headers = {**headers, "ETag": asset.etag}
    if _not_modified(request, asset.etag):
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.content_type, headers=headers)


# Plain `def` handlers: the first call reads the files, which must not block the event loop.
@router.api_route("/", methods=["GET", "HEAD"], summary="The chat UI")
def page(request: Request) -> Response:
    return _serve(rendered_page(request.scope.get("root_path", "")), request, PAGE_HEADERS)


@router.api_route("/ui/{name}", methods=["GET", "HEAD"], summary="A static file of the chat UI")
def asset(name: str, request: Request) -> Response:
    found = assets().get(name)
    if found is None or name == PAGE:  # the page lives at `/` only
        raise NotFound(f"no UI file named {name!r}")
    return _serve(found, request, COMMON_HEADERS)
