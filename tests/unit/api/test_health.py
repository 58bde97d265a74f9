"""Health and readiness: per-backend states, a down backend, open without the API key."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pydantic import SecretStr

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.errors import UpstreamError
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends

pytestmark = pytest.mark.anyio


async def test_health_and_readiness(client_for: ClientFactory) -> None:
    client = await client_for()
    assert (await client.get("/v1/health_check")).json()["status"] == "ok"
    ready = await client.get("/v1/ready")
    assert ready.status_code == 200
    assert set(ready.json()["backends"]) == {"embedder", "retriever", "reranker", "llm"}
    assert ready.json()["backends"]["retriever"]["chunks"] == 4


class _DownEmbedder(HashingEmbedder):
    async def describe(self) -> dict[str, Any]:
        raise UpstreamError("embedder: GET /health failed", backend="embedder")


async def test_readiness_reports_a_down_backend(
    client_for: ClientFactory, settings: Settings
) -> None:
    client = await client_for(await make_backends(settings, embedder=_DownEmbedder()))
    ready = await client.get("/v1/ready")
    assert ready.status_code == 503
    assert ready.json()["backends"]["embedder"]["ready"] is False
    assert ready.json()["backends"]["llm"]["ready"] is True


async def test_api_key_guards_everything_but_health(
    client_for: ClientFactory, settings: Settings
) -> None:
    locked = settings.model_copy(update={"chatqna_api_key": SecretStr("s3cret")})
    client = await client_for(await make_backends(locked), locked)
    assert (await client.get("/v1/health_check")).status_code == 200
    assert (await client.get("/v1/ready")).status_code == 200
    for method, path in [
        ("POST", "/v1/chatqna"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/dataprep/get"),
        ("POST", "/v1/dataprep/delete"),
        ("POST", "/v1/dataprep/ingest"),
    ]:
        response = await client.request(method, path, json={"messages": "hi"})
        assert response.status_code == 401, path
        assert response.json()["error"] == "unauthorized"
        wrong = await client.request(method, path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401, path
    ok = await client.post(
        "/v1/chatqna",
        json={"messages": "hi", "stream": False},
        headers={"Authorization": "Bearer s3cret"},
    )
    assert ok.status_code == 200


async def test_readiness_probes_start_no_client_spans(
    client_for: ClientFactory, settings: Settings, spans: InMemorySpanExporter
) -> None:
    # A probe every few seconds per replica would fill the trace view with one-span traces.
    probed: list[str] = []

    def models(request: httpx2.Request) -> httpx2.Response:
        probed.append(request.url.path)
        return httpx2.Response(200, json={"object": "list", "data": [{"id": "served"}]})

    llm = OpenAIChatLLM("http://llm.test/v1", "served", transport=httpx2.MockTransport(models))
    client = await client_for(await make_backends(settings, llm=llm))
    assert (await client.get("/v1/ready")).status_code == 200
    assert probed == ["/v1/models"]
    assert [s.name for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT] == []
