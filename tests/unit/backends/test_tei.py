"""TEIEmbedder and TEIReranker against TEI's documented wire formats, mocked with respx."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import numpy as np
import pytest
import respx

from chatqna.backends.tei import TEIEmbedder, TEIReranker, embeddings_bytes, rerank_bytes
from chatqna.documents import Chunk, ScoredChunk
from chatqna.errors import BadUpstreamResponse, UpstreamError, UpstreamTimeout
from chatqna.upstream.policy import RetryPolicy
from tests.unit.backends.conftest import shape

pytestmark = pytest.mark.anyio

BASE = "http://tei.test"


@pytest.fixture
async def embedder() -> AsyncIterator[TEIEmbedder]:
    client = TEIEmbedder(BASE, max_batch=2)
    yield client
    await client.aclose()


@pytest.fixture
async def reranker() -> AsyncIterator[TEIReranker]:
    client = TEIReranker(BASE)
    yield client
    await client.aclose()


def embeddings_body(vectors: list[list[Any]], order: list[int] | None = None) -> dict[str, Any]:
    """A `/v1/embeddings` reply; `order` lists the indexes in the order the server sends them."""
    indexes = range(len(vectors)) if order is None else order
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": vectors[i]} for i in indexes],
        "model": "BAAI/bge-base-en-v1.5",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }


def sent_json(call: Any) -> Any:
    return json.loads(call.request.content)


def echo_embeddings(request: httpx.Request) -> httpx.Response:
    """Answer each text `tN` with the vector [N, 1, 0] (out of order, to exercise sorting)."""
    sent = json.loads(request.content)["input"]
    texts = [sent] if isinstance(sent, str) else sent
    vectors = [[float(text[1:]), 1.0, 0.0] for text in texts]
    return httpx.Response(200, json=embeddings_body(vectors, list(reversed(range(len(texts))))))


def candidates(n: int) -> list[ScoredChunk]:
    return [
        ScoredChunk(
            chunk=Chunk(id=f"c{i}", text=f"passage {i}", source="handbook.md", index=i),
            score=1.0 / (i + 1),
            scores={"fusion": 1.0 / (i + 1)},
        )
        for i in range(n)
    ]


# --------------------------------------------------------------------------- embedder


async def test_embed_sends_exactly_the_input_list(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    route = router.post("/v1/embeddings").respond(json=embeddings_body([[1.0, 0.0], [0.0, 1.0]]))
    result = await embedder.embed(["first text", "second text"])
    assert route.call_count == 1
    assert sent_json(route.calls[0]) == {"input": ["first text", "second text"]}
    assert result.shape == (2, 2)
    assert result.dtype == np.float32


async def test_embed_splits_batches_at_max_batch_in_order(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    route = router.post("/v1/embeddings").mock(side_effect=echo_embeddings)
    texts = [f"t{i}" for i in range(5)]
    result = await embedder.embed(texts)
    assert [sent_json(call)["input"] for call in route.calls] == [
        ["t0", "t1"],
        ["t2", "t3"],
        "t4",  # a lone text goes as a plain string
    ]
    expected = np.array([[i, 1.0, 0.0] for i in range(5)], dtype=np.float64)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(result, expected, rtol=1e-6)
    assert (embedder.calls, embedder.texts_embedded) == (3, 5)


async def test_embed_reorders_rows_by_index(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    vectors = [[1.0, 0.0], [0.0, 1.0]]
    router.post("/v1/embeddings").respond(json=embeddings_body(vectors, order=[1, 0]))
    result = await embedder.embed(["x", "y"])
    np.testing.assert_allclose(result, np.array(vectors), atol=1e-7)


async def test_embed_without_indexes_keeps_the_order_sent(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    body = {"data": [{"embedding": [0.0, 1.0]}, {"embedding": [1.0, 0.0]}]}
    router.post("/v1/embeddings").respond(json=body)
    result = await embedder.embed(["x", "y"])
    np.testing.assert_allclose(result, [[0.0, 1.0], [1.0, 0.0]], atol=1e-7)


@pytest.mark.parametrize(
    "items",
    [
        pytest.param([{"index": 2}, {}, {"index": 0}], id="index-on-some-only"),
        pytest.param([{}, {"index": 1}, {}], id="one-index-only"),
        pytest.param([{"index": True}, {"index": 0}, {"index": 2}], id="bool-index"),
        pytest.param([{"index": 0}, {"index": 1.0}, {"index": 2}], id="float-index"),
        pytest.param([{"index": "0"}, {"index": "1"}, {"index": "2"}], id="string-indexes"),
        pytest.param([{"index": 0}, {"index": 0}, {"index": 2}], id="repeated-index"),
        pytest.param([{"index": 1}, {"index": 2}, {"index": 3}], id="indexes-from-one"),
        pytest.param([{"index": None}, {"index": 1}, {"index": 2}], id="null-index"),
    ],
)
async def test_embed_indexes_must_name_every_input_once_or_be_absent(
    router: respx.MockRouter, items: list[dict[str, Any]]
) -> None:
    vectors = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    data = [{**item, "embedding": vector} for item, vector in zip(items, vectors, strict=True)]
    router.post("/v1/embeddings").respond(json={"data": data})
    embedder = TEIEmbedder(BASE)
    try:
        with pytest.raises(BadUpstreamResponse) as info:
            await embedder.embed(["a", "b", "c"])
    finally:
        await embedder.aclose()
    assert shape(info.value) == (502, "bad_upstream_response", "embedder")


async def test_embed_rows_are_l2_normalised(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    router.post("/v1/embeddings").respond(json=embeddings_body([[3.0, 4.0], [0.0, -2.0]]))
    result = await embedder.embed(["a", "b"])
    np.testing.assert_allclose(result, [[0.6, 0.8], [0.0, -1.0]], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(result, axis=1), [1.0, 1.0], rtol=1e-6)


@pytest.mark.parametrize("status", [500, 503, 413, 422])
async def test_embed_http_error_is_upstream_error(
    router: respx.MockRouter, embedder: TEIEmbedder, status: int
) -> None:
    router.post("/v1/embeddings").respond(status, json={"error": "nope", "error_type": "x"})
    with pytest.raises(UpstreamError) as info:
        await embedder.embed(["a"])
    assert type(info.value) is UpstreamError
    assert shape(info.value) == (502, "upstream_error", "embedder")
    assert str(status) in info.value.message


@pytest.mark.parametrize("exc", [httpx2.ReadTimeout, httpx2.ConnectTimeout])
async def test_embed_timeout_is_upstream_timeout(
    router: respx.MockRouter, embedder: TEIEmbedder, exc: type[httpx2.TimeoutException]
) -> None:
    router.post("/v1/embeddings").mock(side_effect=exc("slow"))
    with pytest.raises(UpstreamTimeout) as info:
        await embedder.embed(["a"])
    assert shape(info.value) == (504, "upstream_timeout", "embedder")


async def test_embed_connection_error_is_upstream_error(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    router.post("/v1/embeddings").mock(side_effect=httpx2.ConnectError("refused"))
    with pytest.raises(UpstreamError) as info:
        await embedder.embed(["a"])
    assert type(info.value) is UpstreamError
    assert shape(info.value) == (502, "upstream_error", "embedder")


async def test_embed_non_json_body_is_bad_response(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    router.post("/v1/embeddings").respond(200, text="<html>gateway</html>")
    with pytest.raises(BadUpstreamResponse) as info:
        await embedder.embed(["a"])
    assert shape(info.value) == (502, "bad_upstream_response", "embedder")


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(json.dumps(embeddings_body([[1.0, 0.0]])), id="one-for-two"),
        pytest.param(json.dumps(embeddings_body([[1.0]] * 3)), id="three-for-two"),
        pytest.param('{"object": "list", "model": "m"}', id="missing-data"),
        pytest.param('{"data": {"0": [1.0]}}', id="data-not-list"),
        pytest.param("[[1.0, 0.0], [0.0, 1.0]]", id="bare-list"),
        pytest.param(json.dumps(embeddings_body([["a", "b"], ["c", "d"]])), id="non-numeric"),
        pytest.param(
            '{"data": [{"index": 0, "embedding": [NaN, 1.0]}, {"index": 1, "embedding": [1, 0]}]}',
            id="nan",
        ),
        pytest.param(json.dumps(embeddings_body([[1.0, 0.0], [1.0]])), id="ragged"),
        pytest.param(json.dumps(embeddings_body([[], []])), id="empty-vectors"),
        pytest.param('{"data": [{"index": 0}, {"index": 1}]}', id="no-embedding-key"),
    ],
)
async def test_embed_malformed_body_is_bad_response(
    router: respx.MockRouter, embedder: TEIEmbedder, content: str
) -> None:
    router.post("/v1/embeddings").respond(200, content=content.encode())
    with pytest.raises(BadUpstreamResponse) as info:
        await embedder.embed(["a", "b"])
    assert shape(info.value) == (502, "bad_upstream_response", "embedder")


async def test_a_reply_of_another_width_than_expected_fails_alone(
    router: respx.MockRouter,
) -> None:
    router.post("/v1/embeddings").mock(
        side_effect=[
            httpx.Response(200, json=embeddings_body([[1.0, 0.0]])),
            httpx.Response(200, json=embeddings_body([[1.0, 0.0, 0.0]])),
        ]
    )
    embedder = TEIEmbedder(BASE, dimension=3)
    try:
        with pytest.raises(BadUpstreamResponse, match="dimension 2, expected 3") as info:
            await embedder.embed(["a"])
        assert shape(info.value) == (502, "bad_upstream_response", "embedder")
        assert (await embedder.embed(["b"])).shape == (1, 3)
    finally:
        await embedder.aclose()
    assert embedder.dimension == 3


async def test_a_reply_does_not_fix_the_width_of_later_ones(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    # Without an index to hold it to (a retriever service searches), one wrong reply
    # must not fail every later, right one.
    router.post("/v1/embeddings").mock(
        side_effect=[
            httpx.Response(200, json=embeddings_body([[1.0] * 4])),
            httpx.Response(200, json=embeddings_body([[1.0] * 8])),
            httpx.Response(200, json=embeddings_body([[1.0] * 8])),
        ]
    )
    assert (await embedder.embed(["wrong"])).shape == (1, 4)
    assert (await embedder.embed(["right"])).shape == (1, 8)
    assert (await embedder.embed(["right again"])).shape == (1, 8)
    assert embedder.dimension is None


async def test_without_an_index_width_replies_are_held_to_the_latest_probe(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    def reply(width: int) -> httpx.Response:
        return httpx.Response(200, json=embeddings_body([[1.0] * width]))

    router.post("/v1/embeddings").mock(
        side_effect=[reply(4), reply(8), reply(8), reply(4), reply(8)]
    )
    assert (await embedder.describe())["dimension"] == 4  # a wrong probe reply
    with pytest.raises(BadUpstreamResponse, match="dimension 8, expected 4"):
        await embedder.embed(["held to the probe"])
    assert (await embedder.describe())["dimension"] == 8  # the next probe measures afresh
    with pytest.raises(BadUpstreamResponse, match="dimension 4, expected 8"):
        await embedder.embed(["a wrong reply"])
    assert (await embedder.embed(["fails alone"])).shape == (1, 8)
    assert embedder.dimension is None


async def test_batches_of_one_call_must_agree_on_the_width(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    router.post("/v1/embeddings").mock(
        side_effect=[
            httpx.Response(200, json=embeddings_body([[1.0, 0.0], [0.0, 1.0]])),
            httpx.Response(200, json=embeddings_body([[1.0, 0.0, 0.0]])),
        ]
    )
    with pytest.raises(BadUpstreamResponse, match=r"batches of dimensions \[2, 3\]"):
        await embedder.embed(["a", "b", "c"])  # max_batch=2: two calls


async def test_a_wider_model_s_full_batch_is_reported_as_a_width_mismatch_not_too_large(
    router: respx.MockRouter,
) -> None:
    """A model swapped for a wider one: 32 texts for an index of 384 answered 4,096 wide."""
    texts = [f"t{i}" for i in range(32)]
    vector = [-0.012345678] * 4096  # as TEI writes a normalised vector's numbers
    router.post("/v1/embeddings").respond(json=embeddings_body([vector] * len(texts)))
    embedder = TEIEmbedder(BASE, dimension=384)
    try:
        with pytest.raises(BadUpstreamResponse, match="dimension 4096, expected 384") as info:
            await embedder.embed(texts)
    finally:
        await embedder.aclose()
    assert shape(info.value) == (502, "bad_upstream_response", "embedder")
    assert "larger than" not in str(info.value)


# Unknown, narrower than the 8,192 floor, and wider than it (the bound then follows the width).
@pytest.mark.parametrize("dimension", [None, 3, 16384])
async def test_an_embeddings_answer_far_larger_than_its_vectors_is_refused_unparsed(
    router: respx.MockRouter, dimension: int | None
) -> None:
    """A body of numbers: valid JSON, the vectors right, an extra field far too large."""
    body = embeddings_body([[0.1, 0.2, 0.3]])
    body["extra"] = [0.5] * (embeddings_bytes(1, dimension) // 4)
    router.post("/v1/embeddings").respond(json=body)
    embedder = TEIEmbedder(BASE, dimension=dimension)
    try:
        with pytest.raises(BadUpstreamResponse, match="larger than") as info:
            await embedder.embed(["t1"])
    finally:
        await embedder.aclose()
    assert shape(info.value) == (502, "bad_upstream_response", "embedder")


def test_the_embeddings_bound_holds_a_full_batch_of_the_widest_numbers() -> None:
    widest = -1.2345678901234567e-100
    batch = embeddings_body([[widest] * 4096 for _ in range(32)])
    assert len(json.dumps(batch)) * 2 < embeddings_bytes(32, 4096)
    assert embeddings_bytes(32, None) >= embeddings_bytes(32, 4096)


def test_an_expected_width_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="dimension"):
        TEIEmbedder(BASE, dimension=0)


async def test_bad_response_envelope(router: respx.MockRouter, embedder: TEIEmbedder) -> None:
    router.post("/v1/embeddings").respond(json=embeddings_body([[1.0, 0.0]]))
    with pytest.raises(BadUpstreamResponse) as info:
        await embedder.embed(["a", "b"])
    envelope = info.value.envelope()
    assert set(envelope) == {"error", "message", "backend"}
    assert envelope["error"] == "bad_upstream_response"
    assert envelope["backend"] == "embedder"
    assert "1 embeddings for 2 inputs" in envelope["message"]
    assert info.value.status_code == 502


async def test_embed_rejects_empty_input_without_calling(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    route = router.post("/v1/embeddings")
    with pytest.raises(ValueError):
        await embedder.embed([])
    assert not route.called


async def test_describe_probes_every_time_and_reports_the_width(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    route = router.post("/v1/embeddings").respond(json=embeddings_body([[0.0, 3.0, 4.0, 0.0]]))
    first = await embedder.describe()
    second = await embedder.describe()
    assert route.call_count == 2
    assert sent_json(route.calls[0]) == {"input": "readiness probe"}
    assert first["kind"] == "tei"
    assert first["endpoint"] == BASE
    assert first["dimension"] == second["dimension"] == 4
    assert embedder.dimension is None, "a probe's reply is not kept either"
    # The counters are the service's own embeddings: probes are not among them.
    assert (second["calls"], second["texts_embedded"]) == (0, 0)
    await embedder.embed(["one"])
    assert (embedder.calls, embedder.texts_embedded) == (1, 1)


async def test_describe_fails_when_the_width_is_not_the_expected_one(
    router: respx.MockRouter,
) -> None:
    router.post("/v1/embeddings").respond(json=embeddings_body([[0.0, 3.0, 4.0, 0.0]]))
    embedder = TEIEmbedder(BASE, dimension=3)
    try:
        with pytest.raises(BadUpstreamResponse, match="dimension 4, expected 3"):
            await embedder.describe()
    finally:
        await embedder.aclose()


# --------------------------------------------------------------------------- identity

# TEI's `GET /info` answer, in the shape of its OpenAPI `Info` schema.
TEI_INFO: dict[str, Any] = {
    "model_id": "BAAI/bge-base-en-v1.5",
    "model_sha": "a5beb1e3e68b9ab74eb54cfd186867f64f240e1a",
    "model_dtype": "float16",
    "model_type": {"embedding": {"pooling": "cls"}},
    "max_concurrent_requests": 512,
    "max_input_length": 512,
    "max_batch_tokens": 16384,
    "max_batch_requests": None,
    "max_client_batch_size": 32,
    "auto_truncate": False,
    "tokenization_workers": 4,
    "version": "1.5.0",
    "sha": None,
    "docker_label": None,
}


async def test_identify_names_the_embedder_by_the_model_tei_serves(
    router: respx.MockRouter, embedder: TEIEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    route = router.get("/info").respond(json=TEI_INFO)
    assert embedder.name == "tei:http://tei.test"
    caplog.set_level("INFO", logger="chatqna.backends.tei")
    assert await embedder.identify() == "tei:BAAI/bge-base-en-v1.5"
    assert route.call_count == 1
    assert embedder.name == "tei:BAAI/bge-base-en-v1.5"
    assert embedder.model_id == "BAAI/bge-base-en-v1.5"
    (logged,) = [r for r in caplog.records if "embedder identity" in r.getMessage()]
    assert logged.levelname == "INFO" and "tei:BAAI/bge-base-en-v1.5" in logged.getMessage()


async def test_the_same_model_behind_two_urls_is_one_embedder() -> None:
    def tei(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=TEI_INFO)

    names = []
    for url in ("http://127.0.0.1:6006", "http://tei-embedding-service:80"):
        client = TEIEmbedder(url, transport=httpx2.MockTransport(tei))
        assert client.name == f"tei:{url}"
        names.append(await client.identify())
        await client.aclose()
    assert names == ["tei:BAAI/bge-base-en-v1.5"] * 2


def without_model_id() -> dict[str, Any]:
    return {key: value for key, value in TEI_INFO.items() if key != "model_id"}


@pytest.mark.parametrize(
    ("answer", "found"),
    [
        (httpx.Response(404, json={"error": "not found"}), "HTTP 404"),
        (httpx.Response(405), "HTTP 405"),
        (httpx.Response(200, json=without_model_id()), "no model_id"),
        (httpx.Response(200, json={**TEI_INFO, "model_id": "  "}), "no model_id"),
        (httpx.Response(200, json={**TEI_INFO, "model_id": 7}), "no model_id"),
        (httpx.Response(200, json=["BAAI/bge-base-en-v1.5"]), "no model_id"),
        (httpx.Response(200, text="<html>TEI-compatible</html>"), "not JSON"),
    ],
    ids=["404", "405", "absent", "blank", "number", "list", "html"],
)
async def test_without_a_model_id_from_info_the_url_names_the_embedder(
    router: respx.MockRouter,
    embedder: TEIEmbedder,
    caplog: pytest.LogCaptureFixture,
    answer: httpx.Response,
    found: str,
) -> None:
    router.get("/info").mock(return_value=answer)
    caplog.set_level("INFO", logger="chatqna.backends.tei")
    assert await embedder.identify() == "tei:http://tei.test"
    assert embedder.name == "tei:http://tei.test" and embedder.model_id is None
    (logged,) = [r for r in caplog.records if "embedder identity" in r.getMessage()]
    assert logged.levelname == "INFO" and found in logged.getMessage()
    details = await describe_with_probe(router, embedder)
    assert details["model"] is None and details["endpoint"] == BASE


async def describe_with_probe(router: respx.MockRouter, embedder: TEIEmbedder) -> dict[str, Any]:
    router.post("/v1/embeddings").respond(json=embeddings_body([[0.6, 0.8]]))
    return await embedder.describe()


async def test_describe_names_the_model_identified(
    router: respx.MockRouter, embedder: TEIEmbedder
) -> None:
    router.get("/info").respond(json=TEI_INFO)
    await embedder.identify()
    details = await describe_with_probe(router, embedder)
    assert details["model"] == "BAAI/bge-base-en-v1.5" and details["endpoint"] == BASE


async def test_credentials_in_the_endpoint_never_reach_the_name(router: respx.MockRouter) -> None:
    router.get("/info").respond(404)
    client = TEIEmbedder("http://user:secret@tei.test")
    try:
        assert await client.identify() == "tei:http://tei.test"
    finally:
        await client.aclose()


async def test_identify_retries_by_the_embedder_s_policy_then_fails_rather_than_guess(
    router: respx.MockRouter,
) -> None:
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    route = router.get("/info")
    route.side_effect = [httpx.Response(503), httpx.Response(200, json=TEI_INFO)]
    retry = RetryPolicy(attempts=2, backoff_seconds=0.1, sleep=wait, jitter=lambda: 1.0)
    client = TEIEmbedder(BASE, retry=retry)
    try:
        assert await client.identify() == "tei:BAAI/bge-base-en-v1.5"
        assert route.call_count == 2 and waits == pytest.approx([0.1])
        route.side_effect = None
        route.respond(503)
        with pytest.raises(UpstreamError, match=r"GET /info returned HTTP 503"):
            await client.identify()
    finally:
        await client.aclose()


async def test_identify_is_bounded_by_the_embedding_timeout(router: respx.MockRouter) -> None:
    router.get("/info").mock(side_effect=httpx2.ReadTimeout("stalled"))
    client = TEIEmbedder(BASE, timeout_seconds=0.5)
    try:
        with pytest.raises(UpstreamTimeout, match="GET /info timed out"):
            await client.identify()
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- reranker


async def test_rerank_request_body(router: respx.MockRouter, reranker: TEIReranker) -> None:
    route = router.post("/rerank").respond(json=[{"index": 0, "score": 0.5}])
    await reranker.rerank("how to export?", candidates(3)[:1], top_n=5)
    assert sent_json(route.calls[0]) == {
        "query": "how to export?",
        "texts": ["passage 0"],
        "truncate": True,
    }


async def test_rerank_sorts_maps_and_keeps_top_n(
    router: respx.MockRouter, reranker: TEIReranker
) -> None:
    pool = candidates(4)
    router.post("/rerank").respond(
        json=[
            {"index": 3, "score": 0.2},
            {"index": 1, "score": 0.9},
            {"index": 0, "score": -1.5},
            {"index": 2, "score": 1},
        ]
    )
    result = await reranker.rerank("q", pool, top_n=3)
    assert [item.chunk.id for item in result] == ["c2", "c1", "c3"]
    assert [item.score for item in result] == [1.0, 0.9, 0.2]
    assert [item.scores["rerank"] for item in result] == [1.0, 0.9, 0.2]
    assert result[0].chunk is pool[2].chunk
    assert result[1].scores["fusion"] == pool[1].scores["fusion"]
    assert "rerank" not in pool[1].scores  # candidates are not mutated
    assert reranker.calls == 1


async def test_rerank_top_n_larger_than_pool_returns_all(
    router: respx.MockRouter, reranker: TEIReranker
) -> None:
    router.post("/rerank").respond(json=[{"index": 0, "score": 0.1}, {"index": 1, "score": 0.3}])
    result = await reranker.rerank("q", candidates(2), top_n=10)
    assert [item.chunk.id for item in result] == ["c1", "c0"]


async def test_rerank_empty_candidates_makes_no_call(
    router: respx.MockRouter, reranker: TEIReranker
) -> None:
    route = router.post("/rerank")
    assert await reranker.rerank("q", [], top_n=3) == []
    assert not route.called
    assert reranker.calls == 0


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"results": [{"index": 0, "score": 1.0}]}, id="not-a-list"),
        pytest.param([{"index": 2, "score": 1.0}], id="index-out-of-range"),
        pytest.param([{"index": -1, "score": 1.0}], id="negative-index"),
        pytest.param([{"index": 0, "score": 1.0}, {"index": 0, "score": 0.5}], id="duplicate"),
        pytest.param([{"index": 0}], id="missing-score"),
        pytest.param([{"score": 0.3}], id="missing-index"),
        pytest.param([{"index": 0, "score": "0.9"}], id="string-score"),
        pytest.param([{"index": "0", "score": 0.9}], id="string-index"),
        pytest.param([[0, 0.9]], id="item-not-object"),
    ],
)
async def test_rerank_malformed_body_is_bad_response(
    router: respx.MockRouter, reranker: TEIReranker, body: Any
) -> None:
    router.post("/rerank").respond(json=body)
    with pytest.raises(BadUpstreamResponse) as info:
        await reranker.rerank("q", candidates(2), top_n=2)
    assert shape(info.value) == (502, "bad_upstream_response", "reranker")


async def test_a_rerank_answer_far_larger_than_its_scores_is_refused_unparsed(
    router: respx.MockRouter, reranker: TEIReranker
) -> None:
    padded = [{"index": 0, "score": 0.9, "text": "x" * rerank_bytes(2)}]
    router.post("/rerank").respond(json=padded)
    with pytest.raises(BadUpstreamResponse, match="larger than") as info:
        await reranker.rerank("q", candidates(2), top_n=2)
    assert shape(info.value) == (502, "bad_upstream_response", "reranker")


def test_the_rerank_bound_holds_a_full_answer() -> None:
    scores = [{"index": i, "score": -12.345678901234567} for i in range(100)]
    assert len(json.dumps(scores)) * 2 < rerank_bytes(100)


async def test_rerank_503_is_upstream_error(
    router: respx.MockRouter, reranker: TEIReranker
) -> None:
    router.post("/rerank").respond(503, text="model loading")
    with pytest.raises(UpstreamError) as info:
        await reranker.rerank("q", candidates(2), top_n=2)
    assert type(info.value) is UpstreamError
    assert shape(info.value) == (502, "upstream_error", "reranker")


async def test_rerank_timeout_is_upstream_timeout(
    router: respx.MockRouter, reranker: TEIReranker
) -> None:
    router.post("/rerank").mock(side_effect=httpx2.ReadTimeout("slow"))
    with pytest.raises(UpstreamTimeout) as info:
        await reranker.rerank("q", candidates(2), top_n=2)
    assert shape(info.value) == (504, "upstream_timeout", "reranker")


async def test_injected_transport_is_used_and_closed() -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.path)
        return httpx2.Response(200, json=[{"index": 0, "score": 0.7}])

    transport = httpx2.MockTransport(handler)
    reranker = TEIReranker(BASE, transport=transport)
    result = await reranker.rerank("q", candidates(1), top_n=1)
    await reranker.aclose()
    assert seen == ["/rerank"]
    assert result[0].score == pytest.approx(0.7)
    assert reranker._client.is_closed
