"""Spans per path: names, parents, order, statuses and attributes, from an in-memory exporter."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import httpx
import httpx2
import pytest
from opentelemetry import propagate, trace
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import SecretStr

from chatqna.app import create_app
from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.tei import EMBEDDING_INPUTS, TEIEmbedder
from chatqna.settings import Settings
from chatqna.telemetry import names
from tests.features.conftest import upstream_mock
from tests.features.test_multiturn_blend import TEI, tei_handler
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse

pytestmark = pytest.mark.anyio

LLM = "http://rewriter.test"
CHAT = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings and choose Export."},
    {"role": "user", "content": "Is that possible after I cancel?"},
]


def by_name(spans: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    finished = spans.get_finished_spans()
    return {span.name: span for span in finished}


def server_span(found: dict[str, ReadableSpan]) -> ReadableSpan:
    (server,) = [s for s in found.values() if s.kind == SpanKind.SERVER]
    return server


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


async def _client(
    client_for: ClientFactory,
    settings: Settings,
    rewriter: bool = False,
    llm: ScriptedLLM | None = None,
) -> httpx2.AsyncClient:
    backends = await make_backends(settings, llm=llm or ScriptedLLM())
    if rewriter:
        backends.condense_llm = OpenAIChatLLM(LLM, "rewriter", backend="condense_llm")
    return await client_for(backends, settings)


def completion(content: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ]
        },
    )


async def test_blend_executed_spans(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    blend = settings.model_copy(update={"multi_turn_blend_enabled": True})
    llm = ScriptedLLM()
    client = await _client(client_for, blend, llm=llm)
    response = await client.post("/v1/chatqna", json={"messages": CHAT})
    found = by_name(spans)
    assert names.SPAN_QUERY_CONDENSE not in found, "blend mode never opens the condense span"
    orchestrate = found[names.SPAN_ORCHESTRATE]
    server = server_span(found)
    assert parent_id(orchestrate) == span_id(server)
    for child in (
        names.SPAN_EMBED,
        names.SPAN_RETRIEVE,
        names.SPAN_RERANK,
        names.SPAN_RERANKER_SELECTION,
        names.SPAN_GENERATE,
    ):
        assert parent_id(found[child]) == span_id(orchestrate), child
    attributes = orchestrate.attributes or {}
    assert attributes[names.BLEND_EXECUTED] is True
    assert attributes[names.BLEND_REASON] == "executed"
    assert attributes[names.BLEND_ALPHA] == 0.7
    assert attributes[names.BLEND_HISTORY_TURNS] == 2
    assert attributes[names.BLEND_HISTORY_MESSAGES] == 2
    assert 0.0 <= attributes[names.BLEND_QUESTION_SIMILARITY] < 0.4
    assert attributes[names.HISTORY_ORDER] == "newest_first"
    assert attributes[names.BM25_HISTORY_RAN] is True
    assert (attributes[names.FUSION_DENSE_WEIGHT], attributes[names.FUSION_BM25_WEIGHT]) == (
        1.0,
        0.2,
    )
    assert names.QUERY_TEXT not in attributes, "content is opt-in"
    # Generation ends with the stream, and orchestrate only after it.
    generate = found[names.SPAN_GENERATE]
    assert generate.end_time is not None and orchestrate.end_time is not None
    assert generate.end_time <= orchestrate.end_time
    assert [e.name for e in generate.events] == [names.EVENT_FIRST_TOKEN]
    assert (generate.attributes or {})[names.GEN_AI_OPERATION] == "chat"
    assert (generate.attributes or {})[names.GEN_AI_REQUEST_MODEL] == "scripted"
    # The streamed answer's token counts and reason, from its last delta.
    prompt_words = sum(len(m["content"].split()) for m in llm.prompts[0])
    assert (generate.attributes or {})[names.GEN_AI_INPUT_TOKENS] == prompt_words
    assert (generate.attributes or {})[names.GEN_AI_OUTPUT_TOKENS] == 4
    assert tuple((generate.attributes or {})[names.GEN_AI_FINISH_REASON]) == ("stop",)
    selection = found[names.SPAN_RERANKER_SELECTION].attributes or {}
    kept = json.loads(parse_sse(response.text)[0][1])["source_documents"]
    assert list(selection[names.RERANKER_KEPT_IDS]) == [doc["id"] for doc in kept]
    assert len(selection[names.RERANKER_KEPT_SCORES]) == len(kept)
    assert selection[names.RERANKER_QUERY_KIND] == "conversation"
    assert names.RERANKER_QUERY not in selection, "the rerank query text is content: opt-in"
    # The trace id comes back in a header and in the metadata.
    metadata = json.loads(parse_sse(response.text)[0][1])
    assert response.headers["x-trace-id"] == metadata["trace_id"]
    assert metadata["trace_id"] == format(orchestrate.context.trace_id, "032x")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("update", "messages", "reason"),
    [
        ({"multi_turn_blend_enabled": False}, CHAT, "disabled"),
        ({"multi_turn_blend_enabled": True}, CHAT[-1:], "no_history"),
    ],
)
async def test_blend_skipped_spans(
    client_for: ClientFactory,
    settings: Settings,
    spans: InMemorySpanExporter,
    update: dict[str, object],
    messages: list[dict[str, str]],
    reason: str,
) -> None:
    client = await _client(client_for, settings.model_copy(update=update))
    await client.post("/v1/chatqna", json={"messages": messages, "stream": False})
    found = by_name(spans)
    assert names.SPAN_QUERY_CONDENSE not in found
    attributes = found[names.SPAN_ORCHESTRATE].attributes or {}
    assert attributes[names.BLEND_EXECUTED] is False
    assert attributes[names.BLEND_REASON] == reason


async def test_condense_ok_is_a_sibling_that_ends_before_orchestrate(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    condense = settings.model_copy(
        update={"multi_turn_mode": "condense", "chatqna_trace_content": True}
    )
    with upstream_mock() as router:
        router.post(f"{LLM}/v1/chat/completions").mock(
            return_value=completion('{"standalone_query": "Can I export after I cancel?"}')
        )
        client = await _client(client_for, condense, rewriter=True)
        await client.post("/v1/chatqna", json={"messages": CHAT, "stream": False})
    found = by_name(spans)
    rewrite, orchestrate = found[names.SPAN_QUERY_CONDENSE], found[names.SPAN_ORCHESTRATE]
    server = server_span(found)
    assert parent_id(rewrite) == parent_id(orchestrate) == span_id(server), "siblings"
    assert rewrite.end_time is not None and orchestrate.start_time is not None
    assert rewrite.end_time <= orchestrate.start_time, "condense ends before orchestrate"
    attributes = rewrite.attributes or {}
    assert attributes[names.CONDENSE_STATUS] == "ok"
    assert attributes[names.CONDENSE_HISTORY_SIZE] == 2
    assert float(attributes[names.CONDENSE_LATENCY_MS]) >= 0  # type: ignore[arg-type]
    assert attributes[names.GEN_AI_REQUEST_MODEL] == "rewriter"
    assert attributes[names.CONDENSE_STANDALONE_QUERY] == "Can I export after I cancel?"
    assert rewrite.status.status_code != StatusCode.ERROR
    # The standalone rewrite is the reranker's query; with content tracing on, its text too.
    selection = found[names.SPAN_RERANKER_SELECTION].attributes or {}
    assert selection[names.RERANKER_QUERY_KIND] == "standalone"
    assert selection[names.RERANKER_QUERY] == "Can I export after I cancel?"
    # The rewrite's HTTP client span sits under the condense span.
    client_spans = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert any(parent_id(s) == span_id(rewrite) for s in client_spans)


async def test_a_dense_only_follow_up_reports_no_bm25_leg_and_no_fusion(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    dense = settings.model_copy(
        update={"multi_turn_blend_enabled": True, "retriever_hybrid_retrieval_enabled": False}
    )
    client = await _client(client_for, dense)
    response = await client.post("/v1/chatqna", json={"messages": CHAT})
    assert response.status_code == 200, response.text
    report = json.loads(parse_sse(response.text)[0][1])["retrieval"]
    assert report["hybrid"] is False and report["strategy"] == "blend"
    assert report["bm25_history"] == {"ran": False, "weight": dense.multi_turn_bm25_history_weight}
    assert not {"fusion_weights", "rrf_k", "rrf_candidates"} & report.keys()
    attributes = by_name(spans)[names.SPAN_ORCHESTRATE].attributes or {}
    assert attributes[names.RETRIEVAL_HYBRID] is False
    assert attributes[names.BM25_HISTORY_RAN] is False
    assert names.FUSION_DENSE_WEIGHT not in attributes
    assert names.FUSION_BM25_WEIGHT not in attributes


async def test_the_batched_embedding_call_is_one_client_span_under_embed(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    blend = settings.model_copy(update={"multi_turn_blend_enabled": True})
    with upstream_mock() as router:
        router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        backends = await make_backends(blend, embedder=TEIEmbedder(TEI))
        client = await client_for(backends, blend)
        response = await client.post("/v1/chatqna", json={"messages": CHAT, "stream": False})
    assert response.status_code == 200, response.text
    found = by_name(spans)
    call = found["POST /v1/embeddings"]
    assert call.kind == SpanKind.CLIENT
    assert parent_id(call) == span_id(found[names.SPAN_EMBED])
    attributes = call.attributes or {}
    assert attributes["url.template"] == "/v1/embeddings"
    # query, history and the previous question (the self-contained check), in one call
    assert attributes[EMBEDDING_INPUTS] == 3


async def test_condense_skipped_without_history(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    condense = settings.model_copy(update={"multi_turn_mode": "condense"})
    client = await _client(client_for, condense, rewriter=True)
    await client.post("/v1/chatqna", json={"messages": "How do I export?", "stream": False})
    found = by_name(spans)
    attributes = found[names.SPAN_QUERY_CONDENSE].attributes or {}
    assert attributes[names.CONDENSE_STATUS] == "skipped_no_history"
    assert attributes[names.CONDENSE_HISTORY_SIZE] == 0
    assert names.SPAN_ORCHESTRATE in found
    selection = found[names.SPAN_RERANKER_SELECTION].attributes or {}
    assert selection[names.RERANKER_QUERY_KIND] == "message"


def _timeout(request: httpx.Request) -> httpx.Response:
    raise httpx2.ReadTimeout("slow", request=request)


FAILURES: list[tuple[str, Callable[[httpx.Request], httpx.Response]]] = [
    ("timeout", _timeout),
    ("http_error", lambda request: httpx.Response(500)),
    ("bad_body", lambda request: httpx.Response(200, text="nope")),
    ("missing_field", lambda request: completion('{"q": "x"}')),
    ("empty_query", lambda request: completion('{"standalone_query": ""}')),
]


@pytest.mark.parametrize(("reason", "handler"), FAILURES)
async def test_condense_failed_spans(
    client_for: ClientFactory,
    settings: Settings,
    spans: InMemorySpanExporter,
    reason: str,
    handler: Callable[[httpx.Request], httpx.Response],
) -> None:
    condense = settings.model_copy(update={"multi_turn_mode": "condense"})
    with upstream_mock() as router:
        router.post(f"{LLM}/v1/chat/completions").mock(side_effect=handler)
        client = await _client(client_for, condense, rewriter=True)
        response = await client.post("/v1/chatqna", json={"messages": CHAT})
    assert response.status_code == 503
    found = by_name(spans)
    rewrite = found[names.SPAN_QUERY_CONDENSE]
    attributes = rewrite.attributes or {}
    assert attributes[names.CONDENSE_STATUS] == "failed"
    assert attributes[names.CONDENSE_REASON] == reason
    assert attributes[names.CONDENSE_HISTORY_SIZE] == 2
    assert rewrite.status.status_code == StatusCode.ERROR
    assert names.SPAN_ORCHESTRATE not in found, "a failed rewrite stops the turn"
    assert parent_id(rewrite) == span_id(server_span(found))
    assert response.headers["x-trace-id"] == format(rewrite.context.trace_id, "032x")  # type: ignore[union-attr]


async def test_metrics_count_condense_failures_by_reason(
    client_for: ClientFactory, settings: Settings
) -> None:
    condense = settings.model_copy(update={"multi_turn_mode": "condense"})
    with upstream_mock() as router:
        router.post(f"{LLM}/v1/chat/completions").mock(return_value=httpx.Response(502))
        client = await _client(client_for, condense, rewriter=True)
        for _ in range(2):
            await client.post("/v1/chatqna", json={"messages": CHAT})
        await client.post("/v1/chatqna", json={"messages": "first turn", "stream": False})
    text = (await client.get("/metrics")).text
    assert 'chatqna_condense_total{reason="http_error",status="failed"} 2.0' in text
    # The rewrite LLM's 502s are upstream errors of its backend too.
    assert (
        'chatqna_upstream_errors_total{backend="condense_llm",error="upstream_error"} 2.0' in text
    )
    assert 'chatqna_condense_total{reason="",status="skipped_no_history"} 1.0' in text
    assert 'chatqna_requests_total{method="POST",route="/v1/chatqna",status="503"} 2.0' in text
    assert 'chatqna_stage_seconds_count{stage="retrieve"} 1.0' in text


async def test_metrics_count_blend_and_upstream_errors(
    client_for: ClientFactory, settings: Settings
) -> None:
    from chatqna.errors import UpstreamError

    blend = settings.model_copy(update={"multi_turn_blend_enabled": True})
    llm = ScriptedLLM("a b c", fail_after=1, error=UpstreamError("cut", backend="llm"))
    client = await client_for(await make_backends(blend, llm=llm), blend)
    await client.post("/v1/chatqna", json={"messages": CHAT})
    await client.post("/v1/chatqna", json={"messages": "first", "stream": False})
    text = (await client.get("/metrics")).text
    assert 'chatqna_blend_total{executed="true",reason="executed"} 1.0' in text
    assert 'chatqna_blend_total{executed="false",reason="no_history"} 1.0' in text
    # The stream failed after it started (an error event) and is counted too.
    assert 'chatqna_upstream_errors_total{backend="llm",error="upstream_error"} 1.0' in text


@pytest.mark.parametrize("cors", [False, True], ids=["metrics-reports", "cors-between"])
async def test_the_server_span_has_the_status_of_every_answer(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter, cors: bool
) -> None:
    # The server span is outermost: it sees the status of what the guards and CORS answer.
    origin = "https://chat.example.com"
    chosen = settings.model_copy(
        update={
            "chatqna_api_key": SecretStr("ck-test-key"),
            "chatqna_cors_origins": [origin] if cors else [],
        }
    )
    client = await client_for(None, chosen)
    refused = await client.get("/v1/models")
    assert refused.status_code == 401
    served = await client.get("/v1/models", headers={"Authorization": "Bearer ck-test-key"})
    assert served.status_code == 200
    expected = [401, 200]
    if cors:
        preflight = await client.options(
            "/v1/chatqna",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200
        expected.append(200)
    statuses = [
        (span.attributes or {}).get("http.response.status_code")
        for span in spans.get_finished_spans()
        if span.kind == SpanKind.SERVER
    ]
    assert statuses == expected


async def test_the_server_span_continues_the_callers_trace_and_skips_the_probes(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    client = await client_for(None, settings)
    for probe in ("/v1/health_check", "/metrics"):
        assert (await client.get(probe)).status_code == 200
    assert spans.get_finished_spans() == (), "no span for the probes and the scrape"
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    response = await client.get("/v1/models", headers={"traceparent": caller})
    (server,) = spans.get_finished_spans()
    assert server.kind == SpanKind.SERVER and server.name == "GET /v1/models"
    assert server.parent is not None and server.parent.span_id == 0xB7AD6B7169203331
    assert response.headers["x-trace-id"] == "0af7651916cd43dd8448eb211c80319c"
    attributes = server.attributes or {}
    assert attributes["http.route"] == "/v1/models"
    assert attributes["http.response.status_code"] == 200


@pytest.fixture
def propagators_none() -> Iterator[None]:
    """The global propagator as opentelemetry-api builds it for `OTEL_PROPAGATORS=none`:
    a composite of no propagators."""
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))
    yield
    propagate.set_global_textmap(configured)


@pytest.mark.usefixtures("propagators_none")
async def test_with_propagators_none_requests_are_traced_without_any_context_in_headers(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    condense = settings.model_copy(update={"multi_turn_mode": "condense"})
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with upstream_mock() as router:
        rewrite = router.post(f"{LLM}/v1/chat/completions").mock(
            return_value=completion('{"standalone_query": "Can I export after I cancel?"}')
        )
        client = await _client(client_for, condense, rewriter=True)
        response = await client.post(
            "/v1/chatqna",
            json={"messages": CHAT, "stream": False},
            headers={"traceparent": caller, "baggage": "tenant=acme"},
        )
    assert response.status_code == 200, response.text
    server = server_span(by_name(spans))
    assert server.parent is None, "the caller's context is not taken"
    assert response.headers["x-trace-id"] == format(server.context.trace_id, "032x")  # type: ignore[union-attr]
    assert [s.kind for s in spans.get_finished_spans()].count(SpanKind.CLIENT) == 1
    sent = rewrite.calls.last.request.headers
    assert "traceparent" not in sent and "baggage" not in sent, "none is put in"


@asynccontextmanager
async def untraced_client(
    settings: Settings, backends: Backends
) -> AsyncIterator[httpx2.AsyncClient]:
    """A client on an app given no tracer provider, under no global one: tracing off, as
    with `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`."""
    app = create_app(settings, backends)
    async with app.router.lifespan_context(app):
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(
            transport=transport, base_url="http://localhost:8888"
        ) as client:
            yield client


async def test_with_tracing_off_the_callers_context_goes_upstream_unchanged(
    settings: Settings, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    condense = settings.model_copy(update={"multi_turn_mode": "condense"})
    caller_trace = "0af7651916cd43dd8448eb211c80319c"
    caller = f"00-{caller_trace}-b7ad6b7169203331-01"
    backends = await make_backends(condense, llm=ScriptedLLM())
    backends.condense_llm = OpenAIChatLLM(LLM, "rewriter", backend="condense_llm")
    with upstream_mock() as router:
        rewrite = router.post(f"{LLM}/v1/chat/completions").mock(
            return_value=completion('{"standalone_query": "Can I export after I cancel?"}')
        )
        async with untraced_client(condense, backends) as client:
            turn = {"messages": CHAT, "stream": False}
            response = await client.post(
                "/v1/chatqna", json=turn, headers={"traceparent": caller, "baggage": "tenant=acme"}
            )
            bare = await client.post("/v1/chatqna", json=turn)
            probe = await client.get("/v1/health_check", headers={"traceparent": caller})
    assert response.status_code == 200, response.text
    assert response.headers["x-trace-id"] == caller_trace, "the trace the caller's context names"
    assert response.json()["metadata"]["trace_id"] == caller_trace
    sent = rewrite.calls[0].request.headers
    assert sent["traceparent"] == caller, "the caller's span is the upstream call's parent"
    assert sent["baggage"] == "tenant=acme"
    assert "traceparent" not in rewrite.calls[1].request.headers, "no caller, no context"
    assert "x-trace-id" not in bare.headers and "x-trace-id" not in probe.headers
    assert spans.get_finished_spans() == (), "nothing is recorded"
