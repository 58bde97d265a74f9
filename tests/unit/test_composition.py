"""`build_backends`: which implementation it picks per role (the reranker's choices, the
embedded LLM's second server for rewrites and translations), and that a start-up failing
part-way closes every backend it already built."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import respx

from chatqna import composition
from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.backends.local_reranker import EmbeddingSimilarityReranker
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.tei import TEIEmbedder, TEIReranker
from chatqna.composition import build_reranker
from chatqna.errors import BadUpstreamResponse, IndexUnavailable, StartupFailed
from chatqna.multiturn.history import Message
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.settings import Settings

pytestmark = pytest.mark.anyio


async def test_the_embedded_default_keeps_the_fused_order() -> None:
    settings = Settings()
    assert settings.rerank_skip_reason == "embedded_default"
    assert build_reranker(settings, HashingEmbedder()) is None


async def test_similarity_rescoring_is_opt_in() -> None:
    settings = Settings(chatqna_embedded_reranker="similarity")
    assert settings.rerank_skip_reason is None
    assert isinstance(build_reranker(settings, HashingEmbedder()), EmbeddingSimilarityReranker)


async def test_a_tei_endpoint_reranks_and_rerank_enabled_false_turns_every_reranker_off() -> None:
    settings = Settings(tei_reranking_endpoint="http://127.0.0.1:9")
    reranker = build_reranker(settings, HashingEmbedder())
    assert isinstance(reranker, TEIReranker)
    await reranker.aclose()
    for extra in ({}, {"chatqna_embedded_reranker": "similarity"}):
        off = Settings(tei_reranking_endpoint="http://127.0.0.1:9", rerank_enabled=False, **extra)  # type: ignore[arg-type]
        assert off.rerank_skip_reason == "disabled"
        assert build_reranker(off, HashingEmbedder()) is None


class Closable:
    """A stand-in backend that records when it is closed."""

    def __init__(self, role: str, closed: list[str]) -> None:
        self.role = role
        self.name = role
        self.model = role
        self._closed = closed

    async def aclose(self) -> None:
        self._closed.append(self.role)


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every role builds a `Closable`; the returned list is the order they were closed in."""
    order: list[str] = []

    async def embedder(settings: Settings) -> Closable:
        return Closable("embedder", order)

    async def retriever(settings: Settings, embedder: Any) -> Closable:
        return Closable("retriever", order)

    def reranker(settings: Settings, embedder: Any) -> Closable:
        return Closable("reranker", order)

    monkeypatch.setattr(composition, "build_embedder", embedder)
    monkeypatch.setattr(composition, "build_retriever", retriever)
    monkeypatch.setattr(composition, "build_reranker", reranker)
    return order


async def test_a_failing_llm_closes_the_reranker_retriever_and_embedder(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_llm(settings: Settings) -> Any:
        raise FileNotFoundError("no such GGUF")

    monkeypatch.setattr(composition, "build_llm", broken_llm)
    with pytest.raises(FileNotFoundError, match="no such GGUF"):
        await composition.build_backends(Settings())
    assert closed == ["reranker", "retriever", "embedder"]


async def test_a_failing_condense_llm_also_closes_the_llm(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def llm(settings: Settings) -> Closable:
        return Closable("llm", closed)

    def broken_condense(settings: Settings, llm: Any) -> Any:
        raise ValueError("bad condense endpoint")

    monkeypatch.setattr(composition, "build_llm", llm)
    monkeypatch.setattr(composition, "build_condense_llm", broken_condense)
    with pytest.raises(ValueError, match="bad condense endpoint"):
        await composition.build_backends(Settings())
    assert closed == ["llm", "reranker", "retriever", "embedder"]


async def test_a_failing_retriever_closes_the_embedder(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_retriever(settings: Settings, embedder: Any) -> Any:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(composition, "build_retriever", broken_retriever)
    with pytest.raises(ConnectionError):
        await composition.build_backends(Settings())
    assert closed == ["embedder"]


async def test_without_a_reranker_the_clean_up_skips_it(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_llm(settings: Settings) -> Any:
        raise RuntimeError("llm failed")

    monkeypatch.setattr(composition, "build_reranker", lambda settings, embedder: None)
    monkeypatch.setattr(composition, "build_llm", broken_llm)
    with pytest.raises(RuntimeError):
        await composition.build_backends(Settings())
    assert closed == ["retriever", "embedder"]


async def test_a_tei_embedder_is_held_to_the_width_of_the_embedded_index(
    tmp_path: Path,
) -> None:
    settings = Settings(tei_embedding_endpoint="http://tei.test", chatqna_data_dir=tmp_path)
    embedder = await composition.build_embedder(settings)
    assert isinstance(embedder, TEIEmbedder)
    with respx.mock(using="httpcore2") as router:
        route = router.post("http://tei.test/v1/embeddings")
        route.respond(json={"data": [{"index": 0, "embedding": [0.6, 0.8]}]})
        router.get("http://tei.test/info").respond(json={"model_id": "BAAI/bge-small-en-v1.5"})
        index = await composition.build_retriever(settings, embedder)
        try:
            assert embedder.dimension == 2
            assert embedder.name == "tei:BAAI/bge-small-en-v1.5"
            route.respond(json={"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]})
            with pytest.raises(BadUpstreamResponse, match="dimension 3, expected 2"):
                await embedder.embed(["a query"])
        finally:
            await index.aclose()
            await embedder.aclose()


async def open_through(
    tmp_path: Path, url: str, info: dict[str, Any] | None, embedder_name: str | None = None
) -> TEIEmbedder:
    """Open (then close) the embedded index through a TEI at `url` answering `/info` with
    `info` (None: a 404), over one that `embedder_name` built when given; the embedder,
    identified."""
    if embedder_name is not None:
        index = await EmbeddedHybridIndex.open(
            Settings(chatqna_data_dir=tmp_path).index_dir, embedder_name=embedder_name, dimension=2
        )
        await index.aclose()
    settings = Settings(tei_embedding_endpoint=url, chatqna_data_dir=tmp_path)
    embedder = await composition.build_embedder(settings)
    assert isinstance(embedder, TEIEmbedder)
    with respx.mock(using="httpcore2") as router:
        router.post(f"{url}/v1/embeddings").respond(json={"data": [{"embedding": [0.6, 0.8]}]})
        router.get(f"{url}/info").respond(404 if info is None else 200, json=info)
        try:
            await (await composition.build_retriever(settings, embedder)).aclose()
        finally:
            await embedder.aclose()
    return embedder


MODEL = {"model_id": "BAAI/bge-small-en-v1.5", "model_sha": None}


async def test_an_index_built_through_one_url_opens_through_another_of_the_same_model(
    tmp_path: Path,
) -> None:
    await open_through(tmp_path, "http://127.0.0.1:6006", MODEL)
    reopened = await open_through(tmp_path, "http://tei-embedding-service:80", MODEL)
    assert reopened.name == "tei:BAAI/bge-small-en-v1.5"


async def test_an_index_built_by_another_model_is_refused_at_start_up(tmp_path: Path) -> None:
    await open_through(tmp_path, "http://tei.test", MODEL)
    other = {"model_id": "BAAI/bge-small-zh-v1.5"}
    refused = re.escape("built with embedder 'tei:BAAI/bge-small-en-v1.5'")
    with pytest.raises(StartupFailed, match=refused):
        await open_through(tmp_path, "http://tei.test", other)


async def test_an_index_named_by_the_url_is_refused_once_the_server_names_its_model(
    tmp_path: Path,
) -> None:
    # Built through a server without `/info`: which model made its vectors is not known.
    refused = re.escape("built with embedder 'tei:http://tei.test'")
    with pytest.raises(StartupFailed, match=refused):
        await open_through(tmp_path, "http://tei.test", MODEL, "tei:http://tei.test")


async def test_a_tei_without_info_is_named_by_its_url_as_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="chatqna.backends.tei")
    embedder = await open_through(tmp_path, "http://tei.test", None, "tei:http://tei.test")
    assert embedder.name == "tei:http://tei.test"
    assert any("tei:http://tei.test" in r.getMessage() for r in caplog.records)
    with pytest.raises(StartupFailed, match=re.escape("built with embedder 'tei:http://tei.test'")):
        await open_through(tmp_path, "http://tei.other", None)


async def test_the_embedded_embedder_keeps_its_name(tmp_path: Path) -> None:
    embedder = HashingEmbedder(dimension=2)
    index = await composition.build_retriever(Settings(chatqna_data_dir=tmp_path), embedder)
    await index.aclose()
    meta = sqlite3.connect(tmp_path / "index" / "chunks.sqlite3").execute(
        "SELECT value FROM meta WHERE key='embedder'"
    )
    assert meta.fetchone() == (embedder.name,)


async def test_with_a_retriever_service_the_embedder_width_is_left_open() -> None:
    settings = Settings(
        tei_embedding_endpoint="http://tei.test", retriever_endpoint="http://retriever.test"
    )
    embedder = await composition.build_embedder(settings)
    retriever = await composition.build_retriever(settings, embedder)
    try:
        assert isinstance(embedder, TEIEmbedder) and embedder.dimension is None
    finally:
        await retriever.aclose()
        await embedder.aclose()


# --- the embedded LLM's second server, for condense rewrites and history translations ---

SPANISH = "¿Cómo puedo exportar mis datos después de cancelar la suscripción?"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, False),  # blend is off by default: no turn rewrites or translates
        ({"multi_turn_blend_enabled": True}, True),
        ({"multi_turn_blend_enabled": True, "multi_turn_translate_history": False}, False),
        ({"multi_turn_mode": "condense"}, True),
        ({"multi_turn_mode": "condense", "multi_turn_blend_enabled": True}, True),
        (
            {
                "multi_turn_mode": "condense",
                "condense_llm_endpoint": "http://condense.test/v1",
                "condense_llm_model_id": "small",
            },
            False,
        ),
        (
            {
                "multi_turn_blend_enabled": True,
                "condense_llm_endpoint": "http://condense.test/v1",
                "condense_llm_model_id": "small",
            },
            True,  # translations still go to the embedded LLM
        ),
        ({"multi_turn_mode": "condense", "multi_turn_history_turns": 0}, False),
        ({"multi_turn_mode": "condense", "chatqna_llm_rewrite_server": False}, False),
        ({"multi_turn_blend_enabled": True, "chatqna_llm_rewrite_server": False}, False),
        ({"multi_turn_blend_enabled": True, "multi_turn_history_turns": 0}, False),
        (
            {"multi_turn_mode": "condense", "llm_endpoint": "http://llm.test", "llm_model_id": "m"},
            False,
        ),
        (
            {
                "multi_turn_blend_enabled": True,
                "llm_endpoint": "http://llm.test",
                "llm_model_id": "m",
            },
            False,
        ),
    ],
)
def test_a_rewrite_server_runs_only_for_an_embedded_llm_that_rewrites_or_translates(
    overrides: dict[str, Any], expected: bool
) -> None:
    assert composition.uses_rewrite_server(Settings(**overrides)) is expected


class RecordingLLM(ScriptedLLM):
    """A stand-in LLM named after the server it stands for; records when it is closed."""

    def __init__(self, backend: str, closed: list[str]) -> None:
        super().__init__("How can I export my data after cancelling?", model=backend)
        self._closed = closed

    async def aclose(self) -> None:
        self._closed.append(self.model)


@pytest.fixture
def embedded_servers(closed: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every embedded llama.cpp server is a `RecordingLLM`; returns their names in start order."""
    started: list[str] = []

    async def start(settings: Settings, *, backend: str) -> RecordingLLM:
        started.append(backend)
        return RecordingLLM(backend, closed)

    monkeypatch.setattr(composition, "start_embedded_llm", start)
    return started


async def test_a_condense_rewrite_goes_to_the_rewrite_server_and_answers_to_the_chat_server(
    closed: list[str], embedded_servers: list[str]
) -> None:
    backends = await composition.build_backends(Settings(multi_turn_mode="condense"))
    assert embedded_servers == ["llm", "rewrite_llm"]
    assert backends.llm.model == "llm"
    assert backends.rewrite_llm is not None and backends.rewrite_llm.model == "rewrite_llm"
    assert backends.condense_llm is backends.rewrite_llm
    ready = await backends.describe()
    assert "rewrite_llm" in ready and "condense_llm" not in ready
    await backends.aclose()
    assert closed[:2] == ["rewrite_llm", "llm"]


async def test_history_translations_go_to_the_rewrite_server(
    closed: list[str], embedded_servers: list[str]
) -> None:
    settings = Settings(
        multi_turn_blend_enabled=True,
        condense_llm_endpoint="http://condense.test/v1",
        condense_llm_model_id="small",
    )
    backends = await composition.build_backends(settings)
    assert embedded_servers == ["llm", "rewrite_llm"]
    assert backends.translator is not None
    outcome = await backends.translator.normalise([Message("user", SPANISH)])
    assert outcome.translated == 1
    llm, rewrites = backends.llm, backends.rewrite_llm
    assert isinstance(llm, RecordingLLM) and isinstance(rewrites, RecordingLLM)
    assert (len(llm.prompts), len(rewrites.prompts)) == (0, 1)
    # The condense endpoint keeps its own client; the rewrite server is reported beside it.
    assert isinstance(backends.condense_llm, OpenAIChatLLM)
    assert {"llm", "rewrite_llm", "condense_llm"} <= set(await backends.describe())
    await backends.aclose()
    assert "rewrite_llm" in closed and "llm" in closed


async def test_without_rewrites_or_translations_one_embedded_server_serves_everything(
    embedded_servers: list[str],
) -> None:
    backends = await composition.build_backends(Settings())
    assert embedded_servers == ["llm"]
    assert backends.rewrite_llm is None and backends.condense_llm is backends.llm
    await backends.aclose()


def test_the_rewrite_server_is_switched_off_by_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MULTI_TURN_MODE", "condense")
    assert composition.uses_rewrite_server(Settings()) is True
    monkeypatch.setenv("CHATQNA_LLM_REWRITE_SERVER", "false")
    assert composition.uses_rewrite_server(Settings()) is False


async def test_with_the_rewrite_server_off_rewrites_share_the_answers_server(
    closed: list[str], embedded_servers: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(multi_turn_mode="condense", chatqna_llm_rewrite_server=False)
    backends = await composition.build_backends(settings)
    assert embedded_servers == ["llm"]
    assert backends.rewrite_llm is None and backends.condense_llm is backends.llm
    # /v1/ready names the one server once, as the chat LLM.
    ready = await backends.describe()
    assert "llm" in ready and not {"rewrite_llm", "condense_llm"} & set(ready)
    assert "wait behind other users' answers" in caplog.text
    await backends.aclose()
    assert closed.count("llm") == 1


async def test_with_the_rewrite_server_off_translations_go_to_the_answers_server(
    closed: list[str], embedded_servers: list[str]
) -> None:
    settings = Settings(
        multi_turn_blend_enabled=True,
        condense_llm_endpoint="http://condense.test/v1",
        condense_llm_model_id="small",
        chatqna_llm_rewrite_server=False,
    )
    backends = await composition.build_backends(settings)
    assert embedded_servers == ["llm"]
    assert backends.translator is not None
    await backends.translator.normalise([Message("user", SPANISH)])
    assert isinstance(backends.llm, RecordingLLM) and len(backends.llm.prompts) == 1
    ready = set(await backends.describe())
    assert {"llm", "condense_llm"} <= ready and "rewrite_llm" not in ready
    await backends.aclose()


async def test_with_nothing_to_rewrite_the_switch_is_not_warned_about(
    embedded_servers: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    backends = await composition.build_backends(Settings(chatqna_llm_rewrite_server=False))
    assert embedded_servers == ["llm"]
    assert "CHATQNA_LLM_REWRITE_SERVER" not in caplog.text
    await backends.aclose()


async def test_a_failing_rewrite_server_closes_the_chat_server_and_the_rest(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def start(settings: Settings, *, backend: str) -> RecordingLLM:
        if backend == "rewrite_llm":
            raise MemoryError("no room for a second server")
        return RecordingLLM(backend, closed)

    monkeypatch.setattr(composition, "start_embedded_llm", start)
    with pytest.raises(MemoryError):
        await composition.build_backends(Settings(multi_turn_mode="condense"))
    assert closed == ["llm", "reranker", "retriever", "embedder"]


async def test_the_rewrite_server_loads_the_chat_server_s_model_context_and_threads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from chatqna.backends import local_llm

    calls: list[dict[str, Any]] = []

    async def start(cls: Any, gguf: Path, **options: Any) -> str:
        calls.append({"gguf": gguf, **options})
        return options["backend"]

    monkeypatch.setattr(local_llm.LlamaCppLLM, "start", classmethod(start))
    settings = Settings(
        multi_turn_mode="condense",
        chatqna_llm_gguf=tmp_path / "model.gguf",
        chatqna_llm_context=2048,
        chatqna_llm_threads=3,
        llm_timeout_seconds=7,
        llm_generation_timeout_seconds=70,
    )
    chat = await composition.build_llm(settings)
    rewrites = await composition.build_rewrite_llm(settings, chat)
    assert (chat, rewrites) == ("llm", "rewrite_llm")
    chat_server, rewrite_server = calls
    assert {**chat_server, "backend": "rewrite_llm"} == rewrite_server
    assert rewrite_server["gguf"] == tmp_path / "model.gguf"
    assert (rewrite_server["context"], rewrite_server["threads"]) == (2048, 3)
    assert rewrite_server["generation_timeout_seconds"] == 70


async def test_a_remote_llm_also_rewrites_and_translates(monkeypatch: pytest.MonkeyPatch) -> None:
    async def start(settings: Settings, *, backend: str) -> Any:
        raise AssertionError("a remote deployment starts no embedded server")

    monkeypatch.setattr(composition, "start_embedded_llm", start)
    settings = Settings(
        multi_turn_mode="condense", llm_endpoint="http://llm.test/v1", llm_model_id="big"
    )
    llm = await composition.build_llm(settings)
    assert await composition.build_rewrite_llm(settings, llm) is llm
    assert composition.build_condense_llm(settings, llm) is llm
    await llm.aclose()


# --- start-up failures: one line that names the variable ------------------------------------


async def test_a_data_dir_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    with pytest.raises(StartupFailed) as raised:
        await composition.build_retriever(Settings(chatqna_data_dir=afile), HashingEmbedder())
    assert str(raised.value) == f"CHATQNA_DATA_DIR must be a directory: {afile} is a file"
    # `chatqna ingest --rebuild` builds in a directory inside it: the file is still named.
    with pytest.raises(StartupFailed) as raised:
        settings = Settings(chatqna_data_dir=afile / ".rebuild")
        await composition.build_retriever(settings, HashingEmbedder())
    assert str(raised.value) == f"CHATQNA_DATA_DIR must be a directory: {afile} is a file"


async def test_an_unreachable_redis_is_named_by_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def refused(url: str, timeout_seconds: float = 10.0) -> bool:
        raise IndexUnavailable(f"Redis index '(probe)' at {url}: connection refused")

    monkeypatch.setattr("chatqna.retrieval.redis.cluster.cluster_enabled", refused)
    settings = Settings(redis_url="redis://redis.test:6379")
    with pytest.raises(StartupFailed, match=r"^REDIS_URL: Redis index .* connection refused$"):
        await composition.build_retriever(settings, HashingEmbedder())


async def test_a_tei_embedder_failing_its_probe_is_named_and_announced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        tei_embedding_endpoint="http://tei.test",
        chatqna_data_dir=tmp_path,
        upstream_retry_attempts=1,
        embedding_timeout_seconds=7,
    )
    embedder = await composition.build_embedder(settings)
    caplog.set_level("INFO", logger="chatqna.composition")
    with respx.mock(using="httpcore2") as router:
        router.post("http://tei.test/v1/embeddings").respond(503)
        with pytest.raises(StartupFailed, match=r"^TEI_EMBEDDING_ENDPOINT: embedder: "):
            await composition.build_retriever(settings, embedder)
    await embedder.aclose()
    (waiting,) = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert "TEI_EMBEDDING_ENDPOINT" in waiting and "1 tries of up to 7s" in waiting


async def test_a_missing_gguf_is_one_line_naming_its_variable(tmp_path: Path) -> None:
    settings = Settings(chatqna_llm_gguf=tmp_path / "absent.gguf")
    with pytest.raises(StartupFailed) as raised:
        await composition.build_llm(settings)
    assert str(raised.value) == f"CHATQNA_LLM_GGUF: no such file: {tmp_path / 'absent.gguf'}"


async def test_an_os_error_is_prefixed_with_the_variable_and_a_bug_is_left_alone() -> None:
    refused = r"^REDIS_URL: \[Errno 111\] refused$"
    with pytest.raises(StartupFailed, match=refused), composition.configured_by("REDIS_URL"):
        raise ConnectionRefusedError(111, "refused")
    with pytest.raises(KeyError), composition.configured_by("REDIS_URL"):
        raise KeyError("a bug")
