"""Fetching `link_list` URLs for dataprep: bounded, checked, all or nothing.

Each URL is fetched with httpx2 within one deadline (`CHATQNA_DATAPREP_LINK_TIMEOUT_SECONDS`),
all of a request's URLs within another (`CHATQNA_DATAPREP_LINKS_TIMEOUT_SECONDS`), and each
within one size cap (`CHATQNA_DATAPREP_LINK_MAX_BYTES`, counted after content decoding). A
`gzip` or `deflate` body (the codings asked for) is inflated in bounded steps, as upstream
answers are (`chatqna.upstream.decoding`), so a compressed bomb is stopped at the cap
without ever being decoded in one large piece; a body in any other coding is refused.
Redirects are followed by hand, at most `CHATQNA_DATAPREP_LINK_MAX_REDIRECTS` times, and
every hop's host goes through the `LinkPolicy` before it is contacted. The response's
content type picks the loader; one this service cannot read is refused (415). Each page
becomes an `IngestFile` named by the URL as given, so ingesting the same link again
replaces its chunks. Any failure fails the whole request before anything is ingested.

Direct connections go through `PinnedBackend`. httpx2 leaves the environment's proxy
variables aside when a client is given its own transport, so a proxy for links is named
explicitly (`CHATQNA_DATAPREP_LINK_PROXY`); through it, the proxy resolves and connects,
after the service has checked every hop's addresses itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from email.message import Message

import httpx2
import idna

from chatqna import __version__
from chatqna.errors import (
    InvalidRequest,
    LinkRefused,
    LinkUnreadable,
    PayloadTooLarge,
    UnsupportedFileType,
)
from chatqna.ingest.dataprep import IngestFile, RequestBytes
from chatqna.ingest.link_policy import (
    LinkPolicy,
    PinnedBackend,
    PinnedTransport,
    Resolver,
    resolve_checked,
    system_resolver,
)
from chatqna.ingest.loaders import format_of
from chatqna.settings import Settings
from chatqna.upstream.decoding import ACCEPT_ENCODING, decoded_chunks

__all__ = ["LinkFetcher", "parse_link_list"]

_CONTENT_TYPES = {
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/plain": "text",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/json": "json",
    "application/x-ndjson": "jsonl",
    "application/jsonl": "jsonl",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
}
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# The content codings `decoded_chunks` inflates (and the client asks for).
_CODINGS = frozenset({"gzip", "deflate"})
_CONCURRENT_FETCHES = 4
try:  # the package every OpenTelemetry HTTP client instrumentation requires
    from opentelemetry.instrumentation.utils import suppress_http_instrumentation
except ImportError:  # pragma: no cover - then nothing instruments httpx2 to suppress
    suppress_http_instrumentation = nullcontext  # type: ignore[assignment]


def parse_link_list(raw: str | None, limit: int) -> list[str]:
    """OPEA's `link_list` form field: a JSON list of URL strings (empty means none)."""
    if raw is None or not raw.strip():
        return []
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"link_list is not valid JSON: {exc}", reason="bad_link_list") from exc
    except RecursionError as exc:  # nested deeper than the parser goes: not a list of URLs
        raise InvalidRequest(
            "link_list is nested too deeply to be a JSON list of URL strings",
            reason="bad_link_list",
        ) from exc
    if not isinstance(value, list) or not all(isinstance(url, str) for url in value):
        raise InvalidRequest("link_list must be a JSON list of URL strings", reason="bad_link_list")
    urls = [url.strip() for url in value if url.strip()]
    for url in urls:
        try:
            url.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escaped in the JSON
            raise InvalidRequest(
                "link_list holds a URL that is not valid Unicode", reason="bad_link_list"
            ) from None
    if len(urls) > limit:
        raise InvalidRequest(
            f"link_list holds {len(urls)} URLs, more than {limit} (CHATQNA_DATAPREP_MAX_LINKS)",
            reason="too_many_links",
        )
    for url in urls:
        _refuse_credentials(url)
    return urls


def _refuse_credentials(url: str) -> None:
    """Refuse a URL with a user name or password in it (`http://alice:secret@host/`): httpx2
    would send them as Basic credentials, and the URL would be kept as the page's source
    name, shown to everyone who chats. The refusal shows the URL without them."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        return  # refused as unusable when it is fetched
    if parsed.userinfo:
        shown = str(parsed.copy_with(userinfo=b""))
        raise LinkRefused(
            f"{shown}: links are fetched without credentials; remove the user name and "
            "password from the URL (allow-list the host, or publish the page, instead)",
            reason="bad_url",
            details={"url": shown},
        )


@dataclass(frozen=True)
class _Kind:
    kind: str
    charset: str | None


def _kind_of(url: str, response: httpx2.Response) -> _Kind:
    header = Message()
    header["content-type"] = response.headers.get("content-type", "")
    media_type = header.get_content_type() if "content-type" in response.headers else ""
    charset = header.get_param("charset")
    kind = _CONTENT_TYPES.get(media_type)
    by_name = format_of(httpx2.URL(url).path)
    # A generic type says nothing; a Markdown file is often served as text/plain.
    if media_type in ("", "application/octet-stream") or (kind == "text" and by_name):
        kind = by_name
    if kind is None:
        raise UnsupportedFileType(
            f"{url}: content type {media_type or '(none)'!r} is not one this service reads",
            details={"url": url, "content_type": media_type},
        )
    return _Kind(kind, charset if isinstance(charset, str) else None)


class LinkFetcher:
    """Fetches `link_list` URLs under the settings' bounds and the address policy.

    `resolver` and `transport` exist for tests: a fake resolver maps test names to
    addresses, and a transport replaces the network. By default direct connections go
    through `PinnedBackend`, so the address connected to is one the policy accepted.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        resolver: Resolver | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._policy = LinkPolicy.from_entries(settings.chatqna_dataprep_link_allowlist)
        self._resolver = resolver if resolver is not None else system_resolver
        self._timeout = settings.chatqna_dataprep_link_timeout_seconds
        self._request_timeout = settings.chatqna_dataprep_links_timeout_seconds
        self._max_bytes = settings.chatqna_dataprep_link_max_bytes
        self._max_redirects = settings.chatqna_dataprep_link_max_redirects
        self._proxy = settings.chatqna_dataprep_link_proxy
        self._request_bytes = settings.chatqna_max_upload_request_bytes
        self._transport = transport

    def _client(self) -> httpx2.AsyncClient:
        transport = self._transport
        if transport is None and self._proxy is None:
            transport = PinnedTransport(PinnedBackend(self._policy, self._resolver))
        return httpx2.AsyncClient(
            transport=transport,
            proxy=self._proxy if transport is None else None,
            # Certificate bundles from SSL_CERT_FILE / SSL_CERT_DIR, as for any httpx2 client.
            trust_env=True,
            follow_redirects=False,
            timeout=httpx2.Timeout(self._timeout),
            headers={
                "User-Agent": f"chatqna-dataprep/{__version__}",
                # Not httpx2's default, which adds `br` and `zstd` when their packages are
                # installed: only what is inflated in bounded steps.
                "Accept-Encoding": ACCEPT_ENCODING,
            },
        )

    async def fetch_all(self, urls: Sequence[str]) -> list[IngestFile]:
        """Every URL's content, in order; the first failure fails them all. The bodies
        together may hold `CHATQNA_MAX_UPLOAD_REQUEST_BYTES`, as an upload's files may,
        counted as they arrive, and all are fetched within
        `CHATQNA_DATAPREP_LINKS_TIMEOUT_SECONDS`, however many there are."""
        if not urls:
            return []
        gate = asyncio.Semaphore(_CONCURRENT_FETCHES)
        budget = RequestBytes(self._request_bytes)
        deadline = self._request_timeout
        async with self._client() as client:

            async def bounded(url: str) -> IngestFile:
                async with gate:
                    return await self.fetch(client, url, budget)

            try:
                async with asyncio.timeout(deadline), asyncio.TaskGroup() as group:
                    tasks = [group.create_task(bounded(url)) for url in urls]
            except TimeoutError as exc:
                unfinished = [
                    url for url, task in zip(urls, tasks, strict=True) if task.cancelled()
                ]
                raise LinkUnreadable(
                    f"{len(unfinished)} of {len(urls)} links not fetched within {deadline:g} s "
                    "(CHATQNA_DATAPREP_LINKS_TIMEOUT_SECONDS)",
                    reason="timeout",
                    details={"urls": unfinished},
                ) from exc
            except BaseExceptionGroup as errors:
                # The first failure is the one to report; the group only says they ran
                # side by side.
                raise errors.exceptions[0] from None
        return [task.result() for task in tasks]

    async def fetch(
        self, client: httpx2.AsyncClient, url: str, budget: RequestBytes | None = None
    ) -> IngestFile:
        """One URL, redirects and all, within the deadline; its body counts against
        `budget` (the request's) as well as the per-link cap."""
        try:
            # Outside any HTTP client instrumentation (`opentelemetry-instrument` may patch
            # httpx2): it would send the trace context and baggage to the page's server.
            with suppress_http_instrumentation():
                async with asyncio.timeout(self._timeout):
                    return await self._follow(client, url, budget)
        except TimeoutError as exc:
            raise LinkUnreadable(
                f"{url}: not fetched within {self._timeout:g} s "
                "(CHATQNA_DATAPREP_LINK_TIMEOUT_SECONDS)",
                reason="timeout",
                details={"url": url},
            ) from exc

    async def _follow(
        self, client: httpx2.AsyncClient, url: str, budget: RequestBytes | None
    ) -> IngestFile:
        current = _parse_url(url, url)
        for _ in range(self._max_redirects + 1):
            # The host as it is looked up and as `PinnedBackend` sees it: ASCII (an IDN in
            # its `xn--` form), so an allow-list entry matches both checks alike.
            host = current.raw_host.decode("ascii")
            await resolve_checked(
                self._policy, self._resolver, url, host, current.port or _port(current)
            )
            try:
                async with client.stream("GET", current) as response:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        current = _parse_url(url, response.headers["location"], base=current)
                        continue
                    return await self._read(url, response, budget)
            except httpx2.TimeoutException as exc:
                raise TimeoutError from exc
            except UnicodeError as exc:  # httpx2 decodes a redirect's IDNA host as it reads it
                raise LinkRefused(
                    f"{url}: redirected to a URL whose host is not valid ({exc})",
                    reason="bad_url",
                    details={"url": url},
                ) from exc
            except httpx2.HTTPError as exc:
                raise LinkUnreadable(
                    f"{url}: {type(exc).__name__}: {exc}",
                    reason="connect_error",
                    details={"url": url},
                ) from exc
            except LinkRefused as exc:
                if exc.details.get("url") == url:
                    raise
                # From the pinned connection: the name resolved, a moment after the check,
                # to an address that is not allowed (DNS rebinding).
                address = exc.details.get("address")
                raise LinkRefused(
                    f"{url}: {host} resolved to {address} when connecting, a "
                    f"{str(exc.reason).replace('_', ' ')}; the connection was not made",
                    reason=exc.reason,
                    details={**exc.details, "url": url},
                ) from exc
        raise LinkUnreadable(
            f"{url}: more than {self._max_redirects} redirects "
            "(CHATQNA_DATAPREP_LINK_MAX_REDIRECTS)",
            reason="too_many_redirects",
            details={"url": url},
        )

    async def _read(
        self, url: str, response: httpx2.Response, budget: RequestBytes | None
    ) -> IngestFile:
        if response.status_code >= 300:  # an error, or a redirect with nothing to follow
            raise LinkUnreadable(
                f"{url}: the server answered HTTP {response.status_code}"
                + (" and no Location to follow" if response.status_code < 400 else ""),
                reason="http_status",
                details={"url": url, "status": response.status_code},
            )
        kind = _kind_of(url, response)
        _check_codings(url, response)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_bytes:
            raise self._too_large(url)
        body = bytearray()
        try:
            async for part in decoded_chunks(response):
                body += part
                if len(body) > self._max_bytes:
                    raise self._too_large(url)
                if budget is not None:
                    budget.take(url, len(part))
        except httpx2.DecodingError as exc:
            raise LinkUnreadable(
                f"{url}: the body is not the {response.headers['content-encoding']} it is "
                f"declared to be ({exc})",
                reason="content_encoding",
                details={"url": url},
            ) from exc
        return IngestFile(url, bytes(body), kind=kind.kind, charset=kind.charset)

    def _too_large(self, url: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"{url}: larger than {self._max_bytes} bytes (CHATQNA_DATAPREP_LINK_MAX_BYTES)",
            details={"url": url, "limit": self._max_bytes},
        )


def _check_codings(url: str, response: httpx2.Response) -> None:
    """Refuse a body in a coding not asked for, or encoded more than once."""
    codings = [
        c.strip()
        for c in response.headers.get("content-encoding", "").split(",")
        if c.strip() and c.strip().lower() != "identity"
    ]
    unknown = [c for c in codings if c.lower() not in _CODINGS]
    if unknown:
        raise LinkUnreadable(
            f"{url}: the body is encoded as {', '.join(unknown)}; only gzip and deflate are read",
            reason="content_encoding",
            details={"url": url, "content_encoding": codings},
        )
    if len(codings) > 1:
        # Each layer multiplies what a few bytes unpack to, before the size cap can count.
        raise LinkUnreadable(
            f"{url}: the body is encoded {len(codings)} times over "
            f"({', '.join(codings)}); one content coding at most is read",
            reason="content_encoding",
            details={"url": url, "content_encoding": codings},
        )


def _port(url: httpx2.URL) -> int:
    return 443 if url.scheme == "https" else 80


def _parse_url(original: str, url: str, base: httpx2.URL | None = None) -> httpx2.URL:
    """`url` (relative to `base`, for a redirect's `Location`) as a URL the fetcher may use."""
    try:
        parsed = base.join(url) if base is not None else httpx2.URL(url)
        host = parsed.host
        if b"xn--" in parsed.raw_host:
            # A malformed A-label ("xn--") is an IDNAError; httpx2 shows it as it is.
            idna.decode(parsed.raw_host)
    except (httpx2.InvalidURL, UnicodeError) as exc:
        raise LinkRefused(
            f"{original}: not a usable URL ({exc})", reason="bad_url", details={"url": original}
        ) from exc
    if parsed.scheme not in ("http", "https") or not host:
        raise LinkRefused(
            f"{original}: only http:// and https:// URLs with a host are fetched (got {url!r})",
            reason="bad_url",
            details={"url": original},
        )
    if parsed.userinfo:  # a redirect's: never sent on, as the link's own are never taken
        raise LinkRefused(
            f"{original}: redirected to a URL with credentials in it; it is not followed",
            reason="bad_url",
            details={"url": original},
        )
    return parsed
