"""Blend mode through the API against a TEI-shaped server: one batched call, exact vectors."""

from __future__ import annotations

import json
import logging

import httpx
import httpx2
import numpy as np
import pytest

from chatqna.app import create_app
from chatqna.backends.fakes import (
    HashingEmbedder,
    RecordingReranker,
    RecordingRetriever,
    ScriptedLLM,
)
from chatqna.backends.tei import TEIEmbedder
from chatqna.multiturn.blend import history_text
from chatqna.multiturn.history import Message
from chatqna.settings import Settings
from tests.features.conftest import upstream_mock
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse

pytestmark = pytest.mark.anyio

TEI = "http://tei.test"
FIRST = "How long is data kept after cancellation?"
ANSWER = "Data is kept for 30 days after cancellation."
FOLLOW_UP = "Can you elaborate on this?"
CHAT = [
    {"role": "user", "content": FIRST},
    {"role": "assistant", "content": ANSWER},
    {"role": "user", "content": FOLLOW_UP},
]
HASHER = HashingEmbedder()
GREETING = {"role": "assistant", "content": "Hi! Ask me anything about your account."}


def tei_handler(request: httpx.Request) -> httpx.Response:
    """A TEI-shaped /v1/embeddings: feature-hashing vectors, `input` as string or list."""
    sent = json.loads(request.content)["input"]
    texts = [sent] if isinstance(sent, str) else sent
    data = [
        {"object": "embedding", "index": i, "embedding": HASHER.vector(t).tolist()}
        for i, t in enumerate(texts)
    ]
    return httpx.Response(200, json={"object": "list", "data": data, "model": "tei-test"})


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


@pytest.fixture
def blend_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"multi_turn_blend_enabled": True})


async def _app(
    client_for: ClientFactory, settings: Settings, **extra: object
) -> tuple[httpx2.AsyncClient, RecordingRetriever, RecordingReranker]:
    backends = await make_backends(settings, embedder=TEIEmbedder(TEI), **extra)  # type: ignore[arg-type]
    retriever = RecordingRetriever(backends.retriever)
    reranker = RecordingReranker()
    backends.retriever, backends.reranker = retriever, reranker
    return await client_for(backends, settings), retriever, reranker


async def test_follow_up_makes_one_batched_call_and_searches_with_the_blend(
    client_for: ClientFactory, blend_settings: Settings
) -> None:
    with upstream_mock(assert_all_called=True) as router:
        route = router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        client, retriever, reranker = await _app(client_for, blend_settings)
        response = await client.post("/v1/chatqna", json={"messages": CHAT})
    assert response.status_code == 200
    assert route.call_count == 1
    # The defaults blend the last two messages of both sides, newest first.
    history = history_text([Message("user", FIRST), Message("assistant", ANSWER)], "newest_first")
    assert history == f"{ANSWER}\n{FIRST}"
    # The same call embeds the previous question for the self-contained check.
    sent = json.loads(route.calls[0].request.content)
    assert sent == {"input": [FOLLOW_UP, history, FIRST]}

    eq, eh = unit(HASHER.vector(FOLLOW_UP)), unit(HASHER.vector(history))
    similarity = float(eq @ unit(HASHER.vector(FIRST)))
    assert similarity < blend_settings.multi_turn_self_contained_similarity
    expected = unit(0.7 * eq + 0.3 * eh)
    (query,) = retriever.queries
    np.testing.assert_allclose(query.embedding, expected, rtol=1e-5, atol=1e-7)
    assert query.text == FOLLOW_UP, "BM25 searches with the isolated query"
    # The reranker hears the conversation: the follow-up then the newest earlier question,
    # and the blended vector (what an embedding-similarity reranker scores with).
    assert reranker.queries == [f"{FOLLOW_UP}\n{FIRST}"]
    (rerank_vector,) = reranker.vectors
    assert rerank_vector is not None
    np.testing.assert_allclose(rerank_vector, expected, rtol=1e-5, atol=1e-7)

    metadata = json.loads(parse_sse(response.text)[0][1])
    report = metadata["retrieval"]
    assert report["strategy"] == "blend" and report["query"] == FOLLOW_UP
    assert report["rerank"] == {
        "ran": True,
        "reason": "reranked",
        "query_kind": "conversation",
        "query": f"{FOLLOW_UP}\n{FIRST}",
    }
    assert report["blend"] == {
        "enabled": True,
        "executed": True,
        "reason": "executed",
        "alpha": 0.7,
        "history_turns": 2,
        "history_messages": 2,
        "history_order": "newest_first",
        "history_roles": "user_assistant",
        "question_similarity": pytest.approx(similarity, rel=1e-5),
        "translation": {
            "enabled": True,
            "ran": False,
            "translated": 0,
            "failed": 0,
        },
    }


async def test_a_follow_up_alike_to_the_previous_question_is_searched_on_its_own(
    client_for: ClientFactory, blend_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chatqna.multiturn.blend")
    alike = "How long is data kept after cancellation of a plan?"
    messages = [*CHAT[:2], {"role": "user", "content": alike}]
    eq = unit(HASHER.vector(alike))
    similarity = float(eq @ unit(HASHER.vector(FIRST)))
    assert similarity >= blend_settings.multi_turn_self_contained_similarity
    with upstream_mock() as router:
        route = router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        client, retriever, reranker = await _app(client_for, blend_settings)
        response = await client.post("/v1/chatqna", json={"messages": messages, "stream": False})
    assert response.status_code == 200
    # Still one call; the turn then searches exactly as stateless: its own vector, plain
    # BM25, and the message for the reranker.
    history = f"{ANSWER}\n{FIRST}"
    assert [json.loads(c.request.content) for c in route.calls] == [
        {"input": [alike, history, FIRST]}
    ]
    np.testing.assert_allclose(retriever.queries[0].embedding, eq, rtol=1e-5)
    assert retriever.queries[0].bm25_history_weight == 0.0
    assert reranker.queries == [alike]
    retrieval = response.json()["metadata"]["retrieval"]
    assert retrieval["strategy"] == "stateless"
    assert retrieval["blend"]["executed"] is False
    assert retrieval["blend"]["reason"] == "self_contained"
    assert retrieval["blend"]["question_similarity"] == pytest.approx(similarity, rel=1e-5)
    assert retrieval["bm25_history"]["ran"] is False
    assert any("self_contained" in r.getMessage() for r in caplog.records)

    # With the check off, the same turn is blended.
    off = blend_settings.model_copy(update={"multi_turn_self_contained_similarity": 0.0})
    with upstream_mock() as router:
        route = router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        client, retriever, _ = await _app(client_for, off)
        response = await client.post("/v1/chatqna", json={"messages": messages, "stream": False})
    assert [json.loads(c.request.content) for c in route.calls] == [{"input": [alike, history]}]
    assert response.json()["metadata"]["retrieval"]["blend"]["reason"] == "executed"


@pytest.mark.parametrize(
    ("update", "messages", "reason"),
    [
        ({"multi_turn_blend_enabled": False}, CHAT, "disabled"),
        ({"multi_turn_blend_enabled": True}, [CHAT[-1]], "no_history"),
        # A UI's greeting before the first question is no history: a stateless first turn.
        ({"multi_turn_blend_enabled": True}, [GREETING, CHAT[-1]], "no_history"),
        ({"multi_turn_blend_enabled": True}, [GREETING, GREETING, CHAT[-1]], "no_history"),
        (
            {"multi_turn_blend_enabled": True, "multi_turn_history_turns": 0},
            CHAT,
            "history_turns_zero",
        ),
    ],
)
async def test_no_op_paths_make_the_baseline_call(
    client_for: ClientFactory,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
    update: dict[str, object],
    messages: list[dict[str, str]],
    reason: str,
) -> None:
    caplog.set_level(logging.DEBUG, logger="chatqna.multiturn.blend")
    configured = settings.model_copy(update=update)
    with upstream_mock() as router:
        route = router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        client, retriever, reranker = await _app(client_for, configured)
        response = await client.post("/v1/chatqna", json={"messages": messages, "stream": False})
    assert response.status_code == 200
    assert [json.loads(c.request.content) for c in route.calls] == [{"input": FOLLOW_UP}]
    np.testing.assert_allclose(
        retriever.queries[0].embedding, unit(HASHER.vector(FOLLOW_UP)), rtol=1e-5
    )
    # No blend, no conversation for the reranker: the message and its own vector.
    assert reranker.queries == [FOLLOW_UP]
    np.testing.assert_allclose(reranker.vectors[0], unit(HASHER.vector(FOLLOW_UP)), rtol=1e-5)
    rerank = response.json()["metadata"]["retrieval"]["rerank"]
    assert rerank == {
        "ran": True,
        "reason": "reranked",
        "query_kind": "message",
        "query": FOLLOW_UP,
    }
    blend = response.json()["metadata"]["retrieval"]["blend"]
    assert blend["executed"] is False and blend["reason"] == reason
    assert any(r.name == "chatqna.multiturn.blend" for r in caplog.records)


async def test_alpha_zero_warns_at_start_up(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    configured = settings.model_copy(
        update={"multi_turn_blend_enabled": True, "multi_turn_blend_alpha": 0.0}
    )
    app = create_app(configured, await make_backends(configured))
    async with app.router.lifespan_context(app):
        pass
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("MULTI_TURN_BLEND_ALPHA=0" in r.getMessage() for r in warnings)


async def test_condense_with_blend_flag_warns_at_start_up(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    configured = settings.model_copy(
        update={"multi_turn_blend_enabled": True, "multi_turn_mode": "condense"}
    )
    app = create_app(configured, await make_backends(configured))
    async with app.router.lifespan_context(app):
        pass
    assert any("condense wins" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("cache_size", "calls"), [(0, 2), (16, 1)])
async def test_translation_is_reported_in_metadata_without_telling_a_remembered_one_apart(
    client_for: ClientFactory, blend_settings: Settings, cache_size: int, calls: int
) -> None:
    assert blend_settings.multi_turn_translation_cache_size == 0  # nothing remembered by default
    configured = blend_settings.model_copy(update={"multi_turn_translation_cache_size": cache_size})
    spanish = "¿Cuánto tiempo se guardan los datos después de cancelar la suscripción?"
    llm = ScriptedLLM("How long is data kept after cancelling the subscription?")
    backends = await make_backends(configured, embedder=HashingEmbedder(), llm=llm)
    client = await client_for(backends, configured)
    chat = [{"role": "user", "content": spanish}, *CHAT[1:]]
    reports = []
    for _ in range(2):
        response = await client.post("/v1/chatqna", json={"messages": chat, "stream": False})
        reports.append(response.json()["metadata"]["retrieval"]["blend"]["translation"])
    # With a cache the second turn's translation is remembered, and reads exactly as the
    # first: the metadata must not tell a user that someone else sent the same words before.
    expected = {"enabled": True, "ran": True, "translated": 1, "failed": 0}
    assert reports == [expected, expected]
    # The translation calls; the rest of the prompts are the two answers.
    translations = [p for p in llm.prompts if "Translate" in p[0]["content"]]
    assert len(translations) == calls


async def test_history_aware_bm25_leg_runs_on_blended_follow_ups_only(
    client_for: ClientFactory, blend_settings: Settings
) -> None:
    configured = blend_settings.model_copy(update={"multi_turn_bm25_history_weight": 0.5})
    with upstream_mock() as router:
        router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        client, retriever, _ = await _app(client_for, configured)
        follow = await client.post("/v1/chatqna", json={"messages": CHAT, "stream": False})
        first = await client.post("/v1/chatqna", json={"messages": [CHAT[0]], "stream": False})
    follow_query, first_query = retriever.queries
    assert follow_query.bm25_history == FIRST and follow_query.bm25_history_weight == 0.5
    assert follow_query.text == FOLLOW_UP
    assert follow.json()["metadata"]["retrieval"]["bm25_history"] == {"ran": True, "weight": 0.5}
    # Turn 1 keeps exactly the stateless ranking: no history terms at all.
    assert first_query.bm25_history == "" and first_query.bm25_history_weight == 0.0
    assert first.json()["metadata"]["retrieval"]["bm25_history"]["ran"] is False


async def test_upstream_calls_carry_the_turns_trace_context(
    client_for: ClientFactory, blend_settings: Settings
) -> None:
    with upstream_mock() as router:
        route = router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        client, _, _ = await _app(client_for, blend_settings)
        response = await client.post("/v1/chatqna", json={"messages": CHAT, "stream": False})
    traceparent = route.calls[0].request.headers["traceparent"]
    # W3C trace context: version-traceid-spanid-flags; the trace is the turn's.
    assert traceparent.split("-")[1] == response.headers["x-trace-id"]


async def test_without_a_reranker_the_fused_order_is_kept_and_the_metadata_says_why(
    client_for: ClientFactory, blend_settings: Settings
) -> None:
    with upstream_mock() as router:
        router.post(f"{TEI}/v1/embeddings").mock(side_effect=tei_handler)
        backends = await make_backends(blend_settings, embedder=TEIEmbedder(TEI))
        retriever = RecordingRetriever(backends.retriever)
        backends.retriever, backends.reranker = retriever, None
        client = await client_for(backends, blend_settings)
        response = await client.post("/v1/chatqna", json={"messages": CHAT, "stream": False})
        fused = await retriever.inner.search(retriever.queries[0])
    assert response.status_code == 200
    metadata = response.json()["metadata"]
    assert metadata["retrieval"]["reranker"] is None
    assert metadata["retrieval"]["rerank"] == {
        "ran": False,
        "reason": "embedded_default",
        "query_kind": None,
        "query": None,
    }
    top_n = metadata["retrieval"]["top_n"]
    assert [d["id"] for d in metadata["source_documents"]] == [h.chunk.id for h in fused][:top_n]
