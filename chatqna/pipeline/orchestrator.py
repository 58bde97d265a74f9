"""One chat turn, top to bottom: plan the retrieval query, retrieve, rerank, then generate.

`handle_request` does everything that must happen before the first byte goes out (so a
failure there is a clean HTTP error): it splits the conversation, reads `MULTI_TURN_MODE`
to decide what the retriever searches with, embeds, retrieves (dense + BM25 + RRF, or
dense only), reranks and builds the answer prompt. It returns a `PreparedTurn`, whose
`metadata()` is the SSE metadata event and whose answer is streamed by `generate`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chatqna.backends.factory import Backends
from chatqna.backends.protocols import Completion, Delta, GenerationParams, SearchQuery
from chatqna.documents import ScoredChunk
from chatqna.multiturn.blend import blend_query
from chatqna.multiturn.condense import CondenseOutcome, condense_follow_up
from chatqna.multiturn.history import Conversation, Message, split_conversation
from chatqna.pipeline.prompt import build_answer_prompt
from chatqna.settings import Settings


@dataclass(frozen=True)
class TurnOptions:
    """Per-request knobs: retrieval depth `k`, chunks kept `top_n`, and sampling."""

    k: int
    top_n: int
    params: GenerationParams


@dataclass(frozen=True)
class RetrievalPlan:
    """What the retriever and reranker receive for this turn, and why.

    `embedding` drives the dense leg; `text` drives the BM25 leg and is the reranker's query.
    `report` is what the metadata event says about how retrieval ran.
    """

    text: str
    embedding: np.ndarray
    report: dict[str, Any]


@dataclass
class StageClock:
    """Milliseconds spent per pipeline stage, in the order the stages ran."""

    started: float = field(default_factory=time.perf_counter)
    stages: dict[str, float] = field(default_factory=dict)

    def record(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.stages[stage] = round((now - since) * 1000.0, 3)
        return now

    def total_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000.0, 3)


@dataclass
class PreparedTurn:
    """A turn whose sources are chosen and whose answer prompt is ready."""

    conversation: Conversation
    plan: RetrievalPlan
    sources: list[ScoredChunk]
    prompt: list[dict[str, str]]
    options: TurnOptions
    settings: Settings
    clock: StageClock
    reranker: str | None

    def metadata(self) -> dict[str, Any]:
        return {
            "source_documents": [source_document(item) for item in self.sources],
            "retrieval": {
                **self.plan.report,
                "hybrid": self.settings.retriever_hybrid_retrieval_enabled,
                "reranker": self.reranker,
                "k": self.options.k,
                "top_n": self.options.top_n,
            },
            "timings_ms": dict(self.clock.stages),
        }


def source_document(item: ScoredChunk) -> dict[str, Any]:
    chunk = item.chunk
    return {
        "id": chunk.id,
        "doc_id": chunk.doc_id,
        "source": chunk.source,
        "title": chunk.title,
        "text": chunk.text,
        "score": item.score,
        "scores": dict(item.scores),
    }


async def plan_retrieval(
    conversation: Conversation,
    backends: Backends,
    settings: Settings,
    condensed: CondenseOutcome | None = None,
) -> RetrievalPlan:
    """Decide what the retriever searches with, by `MULTI_TURN_MODE`.

    condense: the standalone query (or, with no history, the raw message) drives the dense
    leg, BM25 and the reranker. blend: the dense leg searches with the blended vector (or the
    query's own vector when the blend does not run); BM25 and the reranker get the isolated
    query text.
    """
    base = {
        "multi_turn_mode": settings.multi_turn_mode,
        "raw_query": conversation.query,
        "history_messages": len(conversation.history),
    }
    if condensed is not None:
        vectors = await backends.embedder.embed([condensed.query])
        report = {
            **base,
            "strategy": "condense" if condensed.rewritten else "stateless",
            "query": condensed.query,
            "condense": condensed.report(),
        }
        return RetrievalPlan(text=condensed.query, embedding=vectors[0], report=report)
    blend = await blend_query(
        conversation,
        backends.embedder,
        enabled=settings.blend_active,
        alpha=settings.multi_turn_blend_alpha,
        history_turns=settings.multi_turn_history_turns,
        translator=backends.translator,
    )
    report = {
        **base,
        "strategy": "blend" if blend.executed else "stateless",
        "query": conversation.query,
        "blend": blend.report(),
    }
    return RetrievalPlan(text=conversation.query, embedding=blend.embedding, report=report)


async def condense_step(
    conversation: Conversation, backends: Backends, settings: Settings
) -> CondenseOutcome | None:
    """In condense mode, rewrite the follow-up (raises `CondenseFailed`); else nothing."""
    if settings.multi_turn_mode != "condense":
        return None
    return await condense_follow_up(
        conversation,
        backends.condense_llm,
        history_turns=settings.multi_turn_history_turns,
        timeout_seconds=settings.condense_timeout_seconds,
        max_chars=settings.condense_max_query_chars,
    )


async def handle_request(
    messages: Sequence[Message], options: TurnOptions, backends: Backends, settings: Settings
) -> PreparedTurn:
    """Everything before generation: a failure here is reported before any byte is sent."""
    clock = StageClock()
    conversation = split_conversation(messages)

    mark = clock.started
    condensed = await condense_step(conversation, backends, settings)
    if condensed is not None:
        mark = clock.record("condense", mark)

    plan = await plan_retrieval(conversation, backends, settings, condensed)
    mark = clock.record("embed", mark)

    candidates = await backends.retriever.search(
        SearchQuery(
            text=plan.text,
            embedding=plan.embedding,
            k=options.k,
            hybrid=settings.retriever_hybrid_retrieval_enabled,
        )
    )
    mark = clock.record("retrieve", mark)

    if backends.reranker is not None:
        sources = await backends.reranker.rerank(plan.text, candidates, options.top_n)
        clock.record("rerank", mark)
    else:
        sources = candidates[: options.top_n]

    prompt = build_answer_prompt(conversation, sources)
    return PreparedTurn(
        conversation=conversation,
        plan=plan,
        sources=sources,
        prompt=prompt,
        options=options,
        settings=settings,
        clock=clock,
        reranker=backends.reranker.name if backends.reranker is not None else None,
    )


async def generate(turn: PreparedTurn, backends: Backends) -> AsyncIterator[Delta]:
    """Stream the answer, recording time to first token and total time on the turn."""
    started = time.perf_counter()
    first = True
    async for delta in backends.llm.stream(turn.prompt, turn.options.params):
        if first and delta.text:
            turn.clock.stages["first_token"] = round((time.perf_counter() - started) * 1000, 3)
            first = False
        yield delta
    turn.clock.stages["generate"] = round((time.perf_counter() - started) * 1000, 3)
    turn.clock.stages["total"] = turn.clock.total_ms()


async def complete(turn: PreparedTurn, backends: Backends) -> Completion:
    """The whole answer at once (non-streaming requests)."""
    started = time.perf_counter()
    completion = await backends.llm.complete(turn.prompt, turn.options.params)
    turn.clock.stages["generate"] = round((time.perf_counter() - started) * 1000, 3)
    turn.clock.stages["total"] = turn.clock.total_ms()
    return completion
