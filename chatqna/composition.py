"""The composition root: `build_backends(settings)` picks an implementation per role, once.

Nothing else imports a concrete backend or index: the API, the pipeline and the multi-turn
strategies see the `Backends` bundle and the Protocols of `chatqna.backends.protocols`.

Each role is embedded unless its endpoint is configured: `TEI_EMBEDDING_ENDPOINT`,
`TEI_RERANKING_ENDPOINT` (without it the fused order is kept, see `build_reranker`),
`LLM_ENDPOINT`, and for the index `RETRIEVER_ENDPOINT` (a retriever service) or `REDIS_URL`
(Redis Stack: one node, or any node of a Redis Cluster).
The condense rewrite uses the chat LLM unless `CONDENSE_LLM_ENDPOINT` names another model;
with the embedded chat LLM, rewrites and history translations get a llama.cpp server of their
own (`build_rewrite_llm`), so they never wait behind an answer, unless
`CHATQNA_LLM_REWRITE_SERVER=false` saves its memory and start-up time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from chatqna.backends.bundle import Backends
from chatqna.backends.no_llm import NoLLM
from chatqna.backends.protocols import (
    ChatLLM,
    Embedder,
    Reranker,
    Retriever,
    embedding_dimension,
)
from chatqna.errors import ChatQnAError, StartupFailed
from chatqna.multiturn.translate import HistoryTranslator
from chatqna.settings import Settings
from chatqna.upstream.policy import RetryPolicy

logger = logging.getLogger(__name__)


def retry_policy(settings: Settings) -> RetryPolicy:
    """Retries for the idempotent upstream calls (embeddings, rerank, retrieval)."""
    return RetryPolicy(
        attempts=settings.upstream_retry_attempts,
        backoff_seconds=settings.upstream_retry_backoff_seconds,
    )


@contextlib.contextmanager
def configured_by(variable: str) -> Iterator[None]:
    """A start-up failure of what `variable` configures, as one `StartupFailed` line that
    starts with its name: our own errors and the OS's (a missing file, a refused
    connection). Anything else is a bug and keeps its traceback."""
    try:
        yield
    except StartupFailed:
        raise
    except (ChatQnAError, OSError) as exc:
        text = str(exc)
        raise StartupFailed(text if text.startswith(variable) else f"{variable}: {text}") from exc


async def build_embedder(settings: Settings) -> Embedder:
    if settings.tei_embedding_endpoint is not None:
        from chatqna.backends.tei import TEIEmbedder

        return TEIEmbedder(
            settings.tei_embedding_endpoint,
            max_batch=settings.tei_embedding_max_batch,
            timeout_seconds=settings.embedding_timeout_seconds,
            connect_timeout_seconds=settings.upstream_connect_timeout_seconds,
            retry=retry_policy(settings),
        )
    from chatqna.backends.local_embedder import OnnxMiniLMEmbedder

    with configured_by("the embedded embedder (TEI_EMBEDDING_ENDPOINT unset)"):
        return await asyncio.to_thread(
            OnnxMiniLMEmbedder, max_batch=settings.tei_embedding_max_batch
        )


async def index_dimension(settings: Settings, embedder: Embedder) -> int:
    """The width the index is opened at: the embedder's, measured by one call when it has
    none. A TEI embedder is then held to it, so a reply of another width fails alone, and
    named by the model it serves (`TEIEmbedder.identify`), which the index checks."""
    from chatqna.backends.tei import TEIEmbedder

    if not isinstance(embedder, TEIEmbedder):
        return await embedding_dimension(embedder)
    logger.info(
        "start-up: waiting for TEI_EMBEDDING_ENDPOINT to embed a probe, %d tries of up to %gs "
        "(UPSTREAM_RETRY_ATTEMPTS, EMBEDDING_TIMEOUT_SECONDS)",
        settings.upstream_retry_attempts,
        settings.embedding_timeout_seconds,
    )
    with configured_by("TEI_EMBEDDING_ENDPOINT"):
        embedder.dimension = await embedding_dimension(embedder)
        await embedder.identify()
    return embedder.dimension


def uses_embedded_index(settings: Settings) -> bool:
    """Whether the configured retriever is the embedded index (no Redis, no retriever service)."""
    return settings.retriever_endpoint is None and settings.redis_url is None


def retriever_variable(settings: Settings) -> str:
    """The variable that chose the index: start-up errors of the index name it."""
    if settings.retriever_endpoint is not None:
        return "RETRIEVER_ENDPOINT"
    return "CHATQNA_DATA_DIR" if settings.redis_url is None else "REDIS_URL"


async def build_retriever(settings: Settings, embedder: Embedder) -> Retriever:
    with configured_by(retriever_variable(settings)):
        return await open_retriever(settings, embedder)


async def open_retriever(settings: Settings, embedder: Embedder) -> Retriever:
    if settings.retriever_endpoint is not None:
        from chatqna.retrieval.remote import RemoteRetriever

        key = settings.chatqna_api_key.get_secret_value() if settings.chatqna_api_key else None
        return RemoteRetriever(
            settings.retriever_endpoint,
            timeout_seconds=settings.retriever_timeout_seconds,
            connect_timeout_seconds=settings.upstream_connect_timeout_seconds,
            headers={"Authorization": f"Bearer {key}"} if key else None,
            retry=retry_policy(settings),
        )
    if settings.redis_url is not None:
        return await build_redis_retriever(settings, settings.redis_url, embedder)
    from chatqna.retrieval.embedded.index import EmbeddedHybridIndex

    # The directory is made if missing; a file where it (or a parent) should be is named.
    data_dir = settings.chatqna_data_dir
    existing = next(path for path in (data_dir, *data_dir.parents) if path.exists())
    if not existing.is_dir():
        raise StartupFailed(f"CHATQNA_DATA_DIR must be a directory: {existing} is a file")
    dimension = await index_dimension(settings, embedder)  # first: it may rename the embedder
    return await EmbeddedHybridIndex.open(
        settings.index_dir,
        embedder_name=embedder.name,
        dimension=dimension,
        rrf_k=settings.rrf_k,
        exact_max=settings.chatqna_embedded_exact_max_chunks,
    )


async def build_redis_retriever(settings: Settings, url: str, embedder: Embedder) -> Retriever:
    """Redis Stack at `url`: one node, or any node of a Redis Cluster (`INFO cluster` says
    which), served by the cluster store with an index on every primary."""
    from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex, cluster_enabled
    from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams

    timeout = settings.redis_timeout_seconds
    logger.info("start-up: connecting to REDIS_URL, up to %gs (REDIS_TIMEOUT_SECONDS)", timeout)
    store = RedisClusterHybridIndex if await cluster_enabled(url, timeout) else RedisHybridIndex
    dimension = await index_dimension(settings, embedder)  # first: it may rename the embedder
    opened: Retriever = await store.open(
        url,
        embedder_name=embedder.name,
        dimension=dimension,
        index_name=settings.index_name,
        vector=VectorIndexParams(
            algorithm=settings.redis_vector_algorithm,
            m=settings.redis_hnsw_m,
            ef_construction=settings.redis_hnsw_ef_construction,
            ef_runtime=settings.redis_hnsw_ef_runtime,
        ),
        rrf_k=settings.rrf_k,
        timeout_seconds=timeout,
        # A connection for every chat the service runs at once; others wait for one.
        max_connections=settings.chatqna_max_concurrent_chats,
    )
    return opened


def build_reranker(settings: Settings, embedder: Embedder) -> Reranker | None:
    """TEI's cross-encoder when configured; without one, the embedded default keeps the
    fused order (None) unless `CHATQNA_EMBEDDED_RERANKER=similarity` asks for the
    embedding-similarity rescoring, which measured below the fused order."""
    if settings.rerank_skip_reason is not None:
        return None
    if settings.tei_reranking_endpoint is not None:
        from chatqna.backends.tei import TEIReranker

        return TEIReranker(
            settings.tei_reranking_endpoint,
            timeout_seconds=settings.rerank_timeout_seconds,
            connect_timeout_seconds=settings.upstream_connect_timeout_seconds,
            retry=retry_policy(settings),
        )
    from chatqna.backends.local_reranker import EmbeddingSimilarityReranker

    return EmbeddingSimilarityReranker(embedder)


def openai_chat_llm(
    settings: Settings,
    endpoint: str,
    model_id: str | None,
    *,
    timeout_seconds: float,
    generation_timeout_seconds: float,
    backend: str,
) -> ChatLLM:
    """An OpenAI-compatible chat server at `endpoint`, sent `OPENAI_API_KEY` when it is set."""
    from chatqna.backends.openai_chat import OpenAIChatLLM

    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return OpenAIChatLLM(
        endpoint,
        model_id or "",
        api_key=key,
        timeout_seconds=timeout_seconds,
        connect_timeout_seconds=settings.upstream_connect_timeout_seconds,
        generation_timeout_seconds=generation_timeout_seconds,
        backend=backend,
    )


async def build_llm(settings: Settings) -> ChatLLM:
    if settings.llm_endpoint is not None:
        return openai_chat_llm(
            settings,
            settings.llm_endpoint,
            settings.llm_model_id,
            timeout_seconds=settings.llm_timeout_seconds,
            generation_timeout_seconds=settings.llm_generation_timeout_seconds,
            backend="llm",
        )
    return await start_embedded_llm(settings, backend="llm")


async def start_embedded_llm(settings: Settings, *, backend: str) -> ChatLLM:
    """One in-process llama.cpp server on the configured GGUF, context and threads."""
    from chatqna.backends.local_llm import LlamaCppLLM

    with configured_by("CHATQNA_LLM_GGUF"):
        return await LlamaCppLLM.start(
            settings.embedded_gguf(),
            context=settings.chatqna_llm_context,
            threads=settings.chatqna_llm_threads,
            timeout_seconds=settings.llm_timeout_seconds,
            connect_timeout_seconds=settings.upstream_connect_timeout_seconds,
            generation_timeout_seconds=settings.llm_generation_timeout_seconds,
            backend=backend,
        )


def rewrites_on_embedded_llm(settings: Settings) -> bool:
    """Whether turns can send condense rewrites or history translations to the embedded
    chat LLM: it is embedded, and condense runs without `CONDENSE_LLM_ENDPOINT` or blend
    translates its history."""
    if settings.llm_endpoint is not None or settings.multi_turn_history_turns == 0:
        return False
    if settings.multi_turn_mode == "condense":
        return settings.condense_llm_endpoint is None
    return settings.blend_active and settings.multi_turn_translate_history


def uses_rewrite_server(settings: Settings) -> bool:
    """Whether the embedded LLM gets a second server for condense rewrites and history
    translations: when `rewrites_on_embedded_llm`, unless `CHATQNA_LLM_REWRITE_SERVER=false`.

    An embedded server generates in one slot, one request at a time, in order. Sharing the
    answers' server, a rewrite or translation would wait behind another user's answer and
    spend its timeout (`CONDENSE_TIMEOUT_SECONDS`, `MULTI_TURN_TRANSLATION_TIMEOUT_SECONDS`)
    in that queue. A second server keeps its own queue, so they wait only for each other;
    it costs a second copy of the model's context and buffers, which an operator with a
    large GGUF may rather not pay.
    """
    return settings.chatqna_llm_rewrite_server and rewrites_on_embedded_llm(settings)


async def build_rewrite_llm(settings: Settings, llm: ChatLLM) -> ChatLLM:
    """The LLM for condense rewrites and history translations: a second embedded server on
    the same GGUF and context when `uses_rewrite_server`, else the chat LLM itself."""
    if not uses_rewrite_server(settings):
        if rewrites_on_embedded_llm(settings):
            logger.warning(
                "CHATQNA_LLM_REWRITE_SERVER=false: condense rewrites and history translations "
                "share the answers' embedded server, wait behind other users' answers and can "
                "time out there"
            )
        return llm
    rewrite_llm = await start_embedded_llm(settings, backend="rewrite_llm")
    logger.info("condense rewrites and history translations have an embedded server of their own")
    return rewrite_llm


def build_condense_llm(settings: Settings, llm: ChatLLM) -> ChatLLM:
    if settings.condense_llm_endpoint is None:
        return llm
    return openai_chat_llm(
        settings,
        settings.condense_llm_endpoint,
        settings.condense_llm_model_id,
        timeout_seconds=settings.condense_timeout_seconds,
        generation_timeout_seconds=settings.condense_timeout_seconds,
        backend="condense_llm",
    )


def build_translator(settings: Settings, llm: ChatLLM) -> HistoryTranslator | None:
    if not settings.multi_turn_translate_history:
        return None
    return HistoryTranslator(
        llm,
        cache_size=settings.multi_turn_translation_cache_size,
        timeout_seconds=settings.multi_turn_translation_timeout_seconds,
    )


async def build_backends(settings: Settings) -> Backends:
    """Build every backend once, at start-up; a failure closes what was already built."""
    built: list[Any] = []
    try:
        embedder = await build_embedder(settings)
        built.append(embedder)
        retriever = await build_retriever(settings, embedder)
        built.append(retriever)
        reranker = build_reranker(settings, embedder)
        if reranker is not None:
            built.append(reranker)
        llm = await build_llm(settings)
        built.append(llm)
        rewrite_llm = await build_rewrite_llm(settings, llm)
        if rewrite_llm is not llm:
            built.append(rewrite_llm)
        condense_llm = build_condense_llm(settings, rewrite_llm)
    except BaseException:
        for backend in reversed(built):
            with contextlib.suppress(Exception):
                await backend.aclose()
        raise
    logger.info(
        "backends: embedder=%s retriever=%s reranker=%s llm=%s",
        embedder.name,
        type(retriever).__name__,
        reranker.name if reranker else "off",
        llm.model,
    )
    translator = build_translator(settings, rewrite_llm)
    own = rewrite_llm if rewrite_llm is not llm else None
    return Backends(embedder, retriever, reranker, llm, condense_llm, translator, rewrite_llm=own)


async def build_retrieval_backends(settings: Settings) -> Backends:
    """Embedder and index only, for the retriever service (no reranker, no LLM)."""
    embedder = await build_embedder(settings)
    try:
        retriever = await build_retriever(settings, embedder)
    except BaseException:
        await embedder.aclose()
        raise
    none = NoLLM()
    return Backends(embedder, retriever, None, none, none, None)
