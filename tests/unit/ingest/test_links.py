"""Fetching `link_list` URLs: content types, redirects, bounds; the network replaced by
`httpx2.MockTransport` and names resolved by a fake resolver."""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable

import httpx2
import pytest
import respx
from opentelemetry import baggage, context
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chatqna.errors import LinkRefused, LinkUnreadable, PayloadTooLarge, UnsupportedFileType
from chatqna.ingest.link_policy import system_resolver
from chatqna.ingest.links import LinkFetcher, parse_link_list
from chatqna.settings import Settings
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

HTML = {"content-type": "text/html; charset=utf-8"}
NAMES = {"docs.test": ["93.184.215.14"], "intranet.test": ["10.1.2.3"]}


async def fake_resolver(host: str, port: int) -> list[str]:
    if host not in NAMES:
        raise OSError(f"unknown host {host}")
    return NAMES[host]


Handler = Callable[[httpx2.Request], httpx2.Response]


def fetcher(handler: Handler, seen: list[str] | None = None, **settings: object) -> LinkFetcher:
    def recording(request: httpx2.Request) -> httpx2.Response:
        if seen is not None:
            seen.append(str(request.url))
        return handler(request)

    return LinkFetcher(
        Settings(**settings),  # type: ignore[arg-type]
        resolver=fake_resolver,
        transport=httpx2.MockTransport(recording),
    )


def page(
    body: bytes, content_type: str = "text/html; charset=utf-8", **kw: object
) -> httpx2.Response:
    return httpx2.Response(200, content=body, headers={"content-type": content_type}, **kw)  # type: ignore[arg-type]


async def test_pages_are_named_by_url_and_typed_by_content_type() -> None:
    bodies = {
        "/guide": page(b"<h1>Guide</h1>", "text/html; charset=ISO-8859-15"),
        "/data": page(b"[1]", "application/json"),
        "/notes.md": page(b"# Notes", "text/plain"),
        "/report.pdf": page(b"%PDF", "application/octet-stream"),
    }
    files = await fetcher(lambda r: bodies[r.url.path]).fetch_all(
        [f"https://docs.test{path}" for path in bodies]
    )
    assert [(f.source, f.kind, f.charset) for f in files] == [
        ("https://docs.test/guide", "html", "ISO-8859-15"),
        ("https://docs.test/data", "json", None),
        ("https://docs.test/notes.md", "markdown", None),
        ("https://docs.test/report.pdf", "pdf", None),
    ]


async def test_redirects_are_followed_and_each_hop_is_checked() -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/old":
            return httpx2.Response(301, headers={"location": "/new"})
        if request.url.path == "/new":
            return page(b"<p>moved</p>")
        return httpx2.Response(302, headers={"location": "http://intranet.test/admin"})

    files = await fetcher(handler, seen).fetch_all(["https://docs.test/old"])
    assert files[0].source == "https://docs.test/old" and files[0].data == b"<p>moved</p>"
    with pytest.raises(LinkRefused) as info:
        await fetcher(handler, seen).fetch_all(["https://docs.test/bounce"])
    assert info.value.reason == "private_address"
    assert info.value.details == {
        "url": "https://docs.test/bounce",
        "host": "intranet.test",
        "address": "10.1.2.3",
    }
    assert not any("intranet.test" in url for url in seen)


async def test_redirect_to_a_metadata_address_literal_is_refused() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(307, headers={"location": "http://169.254.169.254/latest/"})

    with pytest.raises(LinkRefused) as info:
        await fetcher(handler).fetch_all(["https://docs.test/x"])
    assert info.value.reason == "metadata_address"


async def test_too_many_redirects() -> None:
    def loop(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(302, headers={"location": "/again"})

    with pytest.raises(LinkUnreadable) as info:
        await fetcher(loop, chatqna_dataprep_link_max_redirects=3).fetch_all(["https://docs.test/"])
    assert info.value.reason == "too_many_redirects" and info.value.status_code == 422


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://docs.test/a",
        "http:///nohost",
        "http://xn--/",
        "http://xn--a.com/",
    ],
)
async def test_only_http_urls_with_a_host(url: str) -> None:
    with pytest.raises(LinkRefused) as info:
        await fetcher(lambda r: page(b"x")).fetch_all([url])
    assert info.value.reason == "bad_url" and info.value.details == {"url": url}


async def test_unreadable_content_type_is_415() -> None:
    with pytest.raises(UnsupportedFileType) as info:
        await fetcher(lambda r: page(b"\x89PNG", "image/png")).fetch_all(["https://docs.test/logo"])
    assert info.value.details == {"url": "https://docs.test/logo", "content_type": "image/png"}


async def test_http_error_status_is_422() -> None:
    with pytest.raises(LinkUnreadable) as info:
        await fetcher(lambda r: httpx2.Response(404)).fetch_all(["https://docs.test/gone"])
    assert info.value.reason == "http_status" and info.value.details["status"] == 404


@pytest.mark.parametrize("status", [300, 301, 302, 304, 307])
async def test_a_redirect_status_with_no_location_is_not_read_as_the_page(status: int) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, content=b"<p>Multiple choices</p>", headers=HTML)

    with pytest.raises(LinkUnreadable) as info:
        await fetcher(handler).fetch_all(["https://docs.test/choices"])
    assert info.value.reason == "http_status" and info.value.details["status"] == status
    assert "no Location to follow" in info.value.message


async def test_declared_and_streamed_sizes_beyond_the_cap_are_413() -> None:
    small = {"chatqna_dataprep_link_max_bytes": 1000}
    declared = fetcher(lambda r: page(b"x" * 2000), **small)
    with pytest.raises(PayloadTooLarge):
        await declared.fetch_all(["https://docs.test/big"])

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"<p>" + b"y" * 500 + b"</p>"
            await asyncio.sleep(0)

    streamed = fetcher(lambda r: page(endless()), **small)
    with pytest.raises(PayloadTooLarge) as info:
        await streamed.fetch_all(["https://docs.test/endless"])
    assert info.value.details == {"url": "https://docs.test/endless", "limit": 1000}


async def test_a_body_encoded_more_than_once_is_not_unpacked() -> None:
    # Each gzip layer multiplies what a few bytes unpack to (three layers hold 300 MB of
    # zeros in 258 bytes), so a second layer is refused before any is unpacked.
    layered = gzip.compress(gzip.compress(gzip.compress(b"notes")))
    headers = {"content-type": "text/plain", "content-encoding": "gzip, gzip, gzip"}
    bomb = fetcher(lambda r: httpx2.Response(200, content=layered, headers=headers))
    with pytest.raises(LinkUnreadable) as info:
        await bomb.fetch_all(["https://docs.test/bomb"])
    assert info.value.reason == "content_encoding"
    once = {"content-type": "text/plain", "content-encoding": "gzip"}
    plain = fetcher(lambda r: httpx2.Response(200, content=gzip.compress(b"notes"), headers=once))
    assert (await plain.fetch_all(["https://docs.test/notes"]))[0].data == b"notes"


async def test_a_trickle_that_never_ends_is_cut_at_the_deadline() -> None:
    async def trickle() -> AsyncIterator[bytes]:
        while True:
            yield b"."
            await asyncio.sleep(0.05)

    slow = fetcher(lambda r: page(trickle()), chatqna_dataprep_link_timeout_seconds=0.3)
    with pytest.raises(LinkUnreadable) as info:
        await slow.fetch_all(["https://docs.test/slow"])
    assert info.value.reason == "timeout" and info.value.details == {
        "url": "https://docs.test/slow"
    }


async def test_unresolvable_name() -> None:
    with pytest.raises(LinkUnreadable) as info:
        await fetcher(lambda r: page(b"x")).fetch_all(["https://missing.test/"])
    assert info.value.reason == "dns_error"


async def test_a_name_that_rebinds_between_check_and_connect_is_refused() -> None:
    """The pinned connection resolves and checks again, and connects only to what passed:
    a name that answers a public address for the check and a private one for the
    connection never gets the connection."""
    answers = iter([["93.184.215.14"], ["10.0.0.9"]])

    async def rebinding(host: str, port: int) -> list[str]:
        return next(answers)

    real = LinkFetcher(Settings(), resolver=rebinding)  # no transport: the pinned one
    with pytest.raises(LinkRefused) as info:
        await real.fetch_all(["http://rebind.test/page"])
    assert info.value.reason == "private_address"
    assert info.value.details == {
        "url": "http://rebind.test/page",
        "host": "rebind.test",
        "address": "10.0.0.9",
    }
    assert "when connecting" in info.value.message


@pytest.mark.parametrize("location", ["http://[::1", "ftp://docs.test/x", "http://xn--/"])
async def test_a_redirect_to_an_unusable_url_is_refused(location: str) -> None:
    bounce = fetcher(lambda r: httpx2.Response(302, headers={"location": location}))
    with pytest.raises((LinkRefused, LinkUnreadable)) as info:
        await bounce.fetch_all(["https://docs.test/old"])
    assert 400 <= info.value.status_code < 500


@pytest.mark.parametrize("host", ["a" * 64 + ".example", "a..example", ".example"])
async def test_a_host_with_an_empty_or_overlong_label_is_a_bad_url(host: str) -> None:
    # The system resolver's IDNA codec refuses such a name with a UnicodeError, no lookup.
    looked_up: list[str] = []

    async def resolver(name: str, port: int) -> list[str]:
        looked_up.append(name)
        return await system_resolver(name, port)

    fetch = LinkFetcher(Settings(), resolver=resolver, transport=httpx2.MockTransport(page))
    url = f"http://{host}/page.html"
    with pytest.raises(LinkRefused) as info:
        await fetch.fetch_all([url])
    assert (info.value.status_code, info.value.reason) == (403, "bad_url")
    assert info.value.details == {"url": url, "host": host}
    bounce = fetcher(lambda r: httpx2.Response(302, headers={"location": url}))
    with pytest.raises(LinkRefused) as info:
        await bounce.fetch_all(["https://docs.test/old"])
    assert info.value.reason == "bad_url"
    assert info.value.details == {"url": "https://docs.test/old", "host": host}
    assert looked_up == []


async def test_an_idn_host_is_checked_in_its_ascii_form_as_the_connection_sees_it() -> None:
    looked_up: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["10.1.2.3"]

    allowed = LinkFetcher(
        Settings(chatqna_dataprep_link_allowlist=["xn--bcher-kva.test"]),
        resolver=resolver,
        transport=httpx2.MockTransport(lambda r: page(b"<p>Regal</p>")),
    )
    files = await allowed.fetch_all(["http://bücher.test/regal"])
    assert files[0].data == b"<p>Regal</p>"
    assert looked_up == ["xn--bcher-kva.test"]


def streamed(*parts: bytes) -> Callable[[], AsyncIterator[bytes]]:
    """A body that arrives as `parts` over the network (httpx2 does not read it ahead)."""

    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    return body


async def test_a_gzip_bomb_is_inflated_in_bounded_steps_and_stopped_at_the_cap() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    bomb = compressor.compress(b"\0" * (64 << 20)) + compressor.flush()  # 64 MiB in 64 KiB
    headers = {"content-type": "text/plain", "content-encoding": "gzip"}
    sent: list[httpx2.Headers] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request.headers)
        return httpx2.Response(200, content=streamed(bomb)(), headers=headers)

    small = fetcher(handler, chatqna_dataprep_link_max_bytes=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            await small.fetch_all(["https://docs.test/bomb.txt"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # the network read inflated whole would be 64 MiB at once
    assert sent[0]["accept-encoding"] == "gzip, deflate"  # only what is inflated in steps


async def test_a_deflate_body_is_read_and_other_or_broken_codings_are_refused() -> None:
    def answer(coding: str, body: bytes) -> Handler:
        headers = {"content-type": "text/plain", "content-encoding": coding}
        return lambda r: httpx2.Response(200, content=streamed(body)(), headers=headers)

    deflated = fetcher(answer("deflate", zlib.compress(b"notes")))
    assert (await deflated.fetch_all(["https://docs.test/n.txt"]))[0].data == b"notes"
    for coding, body in (("br", b"\x0b\x02\x80notes\x03"), ("gzip", b"not gzip at all")):
        with pytest.raises(LinkUnreadable) as info:
            await fetcher(answer(coding, body)).fetch_all(["https://docs.test/n.txt"])
        assert info.value.reason == "content_encoding"
        assert info.value.details["url"] == "https://docs.test/n.txt"


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:hunter2@wiki.test/page",
        "https://hunter2@wiki.test/page",
        "http://:hunter2@wiki.test/page",
    ],
)
def test_a_link_with_credentials_is_refused_without_showing_them(url: str) -> None:
    with pytest.raises(LinkRefused) as info:
        parse_link_list(json.dumps(["https://docs.test/ok", url]), limit=10)
    assert (info.value.status_code, info.value.reason) == (403, "bad_url")
    assert info.value.details == {"url": url.split("//")[0] + "//wiki.test/page"}
    assert "hunter2" not in info.value.message + json.dumps(info.value.envelope())


async def test_a_redirect_to_a_url_with_credentials_is_not_followed() -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/old":
            return httpx2.Response(302, headers={"location": "https://bob:pw@docs.test/new"})
        return page(b"<p>new</p>")

    with pytest.raises(LinkRefused) as info:
        await fetcher(handler, seen).fetch_all(["https://docs.test/old"])
    assert info.value.reason == "bad_url"
    assert info.value.details == {"url": "https://docs.test/old"}
    assert seen == ["https://docs.test/old"]


async def test_the_links_of_a_request_share_one_byte_budget() -> None:
    body = b"x" * 3000
    urls = [f"https://docs.test/p{i}.txt" for i in range(4)]
    links = fetcher(lambda r: page(body, "text/plain"), chatqna_max_upload_request_bytes=10_000)
    assert len(await links.fetch_all(urls[:3])) == 3  # 9000 bytes
    with pytest.raises(PayloadTooLarge, match="CHATQNA_MAX_UPLOAD_REQUEST_BYTES") as raised:
        await links.fetch_all(urls)  # 12000 bytes
    assert raised.value.reason == "request_too_large"
    assert len(await links.fetch_all(urls[:3])) == 3  # each request has a budget of its own


async def slow_text(request: httpx2.Request, delay: float) -> httpx2.Response:
    await asyncio.sleep(delay)
    return page(b"ok", "text/plain")


async def test_slow_links_that_each_answer_in_time_are_cut_at_the_requests_deadline() -> None:
    # The request's links have 0.5 s together; each answers in 0.1 s, well inside its own
    # 10 s deadline, and 40 of them four at a time take 1 s.
    links = LinkFetcher(
        Settings(
            chatqna_dataprep_link_timeout_seconds=10,
            chatqna_dataprep_links_timeout_seconds=0.5,
        ),
        resolver=fake_resolver,
        transport=httpx2.MockTransport(lambda request: slow_text(request, 0.1)),
    )
    urls = [f"https://docs.test/p{i}.txt" for i in range(40)]
    with pytest.raises(LinkUnreadable, match="CHATQNA_DATAPREP_LINKS_TIMEOUT_SECONDS") as raised:
        await links.fetch_all(urls)
    assert raised.value.reason == "timeout" and raised.value.status_code == 422
    unfinished = raised.value.details["urls"]
    assert unfinished and set(unfinished) < set(urls)
    assert f"{len(unfinished)} of 40 links not fetched within 0.5 s" in raised.value.message


async def test_the_requests_deadline_does_not_follow_the_per_link_one_or_the_link_count() -> None:
    # 96 links four at a time, 0.05 s each: 1.2 s in all, longer than four 0.25 s per-link
    # deadlines, but within the request's own deadline (its default).
    settings = Settings(chatqna_dataprep_link_timeout_seconds=0.25)
    assert settings.chatqna_dataprep_links_timeout_seconds == 120
    links = LinkFetcher(
        settings,
        resolver=fake_resolver,
        transport=httpx2.MockTransport(lambda request: slow_text(request, 0.05)),
    )
    urls = [f"https://docs.test/p{i}.txt" for i in range(96)]
    fetched = await links.fetch_all(urls)
    assert [item.source for item in fetched] == urls


async def test_links_carry_no_trace_context_under_an_http_client_instrumentation(
    spans: InMemorySpanExporter,
) -> None:
    """`opentelemetry-instrument` patches httpx2's own transport, which fetches through
    `CHATQNA_DATAPREP_LINK_PROXY` use: the page's server must not be sent the trace id or
    the baggage, and the fetch starts no span of the instrumentation's."""
    settings = Settings(chatqna_dataprep_link_proxy="http://proxy.test:3128")  # type: ignore[call-arg]
    links = LinkFetcher(settings, resolver=fake_resolver)
    instrumentor = HTTPX2ClientInstrumentor()
    instrumentor.instrument(tracer_provider=TRACER_PROVIDER)
    tracer = TRACER_PROVIDER.get_tracer("test")
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        # httpcore2 is mocked, so the request goes through httpx2's own (instrumented) transport.
        with respx.mock(using="httpcore2") as router, tracer.start_as_current_span("ingest"):
            route = router.route(host="docs.test").respond(
                200, text="ok", headers={"content-type": "text/plain"}
            )
            (fetched,) = await links.fetch_all(["http://docs.test/page.txt"])
    finally:
        context.detach(token)
        instrumentor.uninstrument()
    assert fetched.data == b"ok"
    sent = route.calls[0].request.headers
    assert "traceparent" not in sent and "baggage" not in sent
    assert [span.name for span in spans.get_finished_spans()] == ["ingest"]
