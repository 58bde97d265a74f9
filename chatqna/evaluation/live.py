"""Own history: each conversation replayed as a live service would have seen it.

The datasets' assistant turns are reference answers, written by annotators from the
relevant passages, so they carry the evidence's words for free. A live service sees its own
answers instead, grounded in what it retrieved, right or wrong. With own history the
harness replays each conversation turn by turn under one mode and replaces every earlier
assistant message by what the system itself would have answered at that turn:

- without an LLM, the first `ANSWER_CHARS` (800) characters of the passage it ranked first
  (the passage text, without its title): a proxy for an answer grounded in its own
  retrieval, which carries that passage's words whether or not it was the right one, as
  long as the blend embeds of any history message (`chatqna.multiturn.blend.MESSAGE_CHARS`);
- with `--llm`, the configured LLM's answer from the passages the service would answer
  from: retrieved with its `k` and kept to its `top_n` under the mode's retrieval and
  reranker (`RETRIEVER_K`, `RERANK_TOP_N`), in its own answer prompt
  (`build_answer_prompt`) with its `LLM_MAX_TOKENS`, at temperature 0.

Every user turn of a conversation is replayed, scored or not (an unscored turn's answer
is history for the next). User messages stay as the dataset has them. A first turn has no
history, so it ranks as with reference history.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from chatqna.backends.protocols import ChatLLM, Embedder, Reranker
from chatqna.documents import ScoredChunk
from chatqna.evaluation.dataset import Dataset, EvalTurn
from chatqna.evaluation.follow_up_variants.hedge import hedged_search
from chatqna.evaluation.metrics import turn_metrics
from chatqna.evaluation.modes import BenchPlan, CorpusSignals, Mode, ModeResult, plan_turn
from chatqna.multiturn.blend import MESSAGE_CHARS
from chatqna.multiturn.history import Conversation, Message
from chatqna.pipeline.prompt import build_answer_prompt
from chatqna.pipeline.sources import rerank_or_cut, search_query
from chatqna.pipeline.turn import TurnOptions
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex

logger = logging.getLogger(__name__)

ANSWER_CHARS = MESSAGE_CHARS


Write = Callable[[Conversation, Sequence[ScoredChunk]], Awaitable[str]]


@dataclass(frozen=True)
class Answerer:
    """How a replayed turn is answered: `write` makes the answer from passages, which are
    the turn's scored ranking, or with `options` the passages the service would answer
    from (retrieved with `options.k` and kept to `options.top_n` under the mode)."""

    write: Write
    options: TurnOptions | None = None


@dataclass(frozen=True)
class Dialogue:
    """One conversation's messages up to its last scored turn, and which user message
    (by position) is which scored turn."""

    conversation_id: str
    messages: tuple[Message, ...]
    scored: dict[int, EvalTurn]


def dialogues(dataset: Dataset, turns: Sequence[EvalTurn]) -> list[Dialogue]:
    """Rebuild each conversation from its scored turns (the last one's history holds
    every message before it)."""
    by_conversation: dict[str, list[EvalTurn]] = {}
    for turn in turns:
        by_conversation.setdefault(turn.conversation_id, []).append(turn)
    result = []
    for conversation_id, members in by_conversation.items():
        last = max(members, key=lambda t: len(t.history))
        messages = (*last.history, Message("user", last.query))
        scored = {len(t.history): t for t in members}
        result.append(Dialogue(conversation_id, messages, scored))
    return result


def passage_answerer(texts: dict[str, str]) -> Answerer:
    """The LLM-free proxy: the first `ANSWER_CHARS` characters of the top passage."""

    async def answer(conversation: Conversation, sources: Sequence[ScoredChunk]) -> str:
        if not sources:
            return ""
        top = sources[0].chunk
        return texts.get(top.id, top.text)[:ANSWER_CHARS]

    return Answerer(answer)


def llm_answerer(llm: ChatLLM, options: TurnOptions) -> Answerer:
    """The configured LLM's answer as the service makes it: from the `options.top_n`
    passages it keeps, in its answer prompt, with `options.params`."""

    async def answer(conversation: Conversation, sources: Sequence[ScoredChunk]) -> str:
        completion = await llm.complete(build_answer_prompt(conversation, sources), options.params)
        return completion.text

    return Answerer(answer, options)


async def retrieve(
    mode: Mode,
    plan: BenchPlan,
    index: EmbeddedHybridIndex,
    reranker: Reranker | None,
    k: int,
    top_n: int | None = None,
) -> list[ScoredChunk]:
    """One turn's `k` passages under `mode` (the best `top_n` of them when given), with the
    service's own search query and rerank step (`chatqna.pipeline.sources`). The index is
    searched on this thread with the mode's per-leg depth; a plan with hedging dense legs
    fuses them in (`chatqna.evaluation.follow_up_variants.hedge`)."""
    planned = plan.service
    if planned is None:
        return []
    query = search_query(planned, k, hybrid=mode.hybrid, fusion_weights=mode.fusion_weights)
    if plan.dense_legs and mode.hybrid:
        hits = hedged_search(index, query, plan.dense_legs, mode.candidates)
    else:
        hits = index.search_sync(query, candidates=mode.candidates)
    kept = k if top_n is None else top_n
    return await rerank_or_cut(reranker if mode.rerank else None, planned.rerank, hits, kept)


Step = Callable[[EvalTurn, bool], Awaitable[str]]


async def replay_dialogue(dialogue: Dialogue, step: Step) -> None:
    """Walk one conversation user turn by user turn. `step(turn, scored)` ranks the turn (its
    history holds the answers `step` gave before) and returns the answer that replaces the
    assistant message after it; `scored` says whether the dataset scores the turn."""
    history: list[Message] = []
    answered = ""
    for position, message in enumerate(dialogue.messages):
        if message.role != "user":
            own = message.role == "assistant"
            history.append(Message(message.role, answered) if own else message)
            continue
        scored = dialogue.scored.get(position)
        turn = scored or EvalTurn(dialogue.conversation_id, 0, message.content, (), (), None)
        turn = replace(turn, history=tuple(history))
        answered = await step(turn, scored is not None)
        history.append(message)


async def replay_mode(
    mode: Mode,
    conversations: Sequence[Dialogue],
    index: EmbeddedHybridIndex,
    embedder: Embedder,
    llm: ChatLLM | None,
    reranker: Reranker | None,
    answer: Answerer,
    *,
    depth: int = 10,
    tick: Callable[[int], None] | None = None,
    signals: CorpusSignals | None = None,
) -> tuple[ModeResult, dict[str, BenchPlan]]:
    """Rank every scored turn of `conversations` under `mode` with own history."""
    result = ModeResult(mode)
    plans: dict[str, BenchPlan] = {}

    async def step(turn: EvalTurn, scored: bool) -> str:
        plan = await plan_turn(turn, mode.query, embedder, llm, signals=signals)
        hits = await retrieve(mode, plan, index, reranker, depth)
        sources, served = hits, answer.options
        if served is not None:  # the passages the service would answer from
            sources = await retrieve(mode, plan, index, reranker, served.k, served.top_n)
        answered = await answer.write(turn.conversation(), sources)
        if not scored:
            return answered
        ranking = [hit.chunk.id for hit in hits]
        plans[turn.key] = plan
        if plan.failure is not None:
            result.failures[turn.key] = plan.failure
        result.rankings[turn.key] = ranking
        result.per_turn[turn.key] = turn_metrics(ranking, turn.relevant_ids)
        logger.debug(
            "own history %s | %s: R@5 %.2f, top %s",
            mode.label,
            turn.key,
            result.per_turn[turn.key]["R@5"],
            ranking[0] if ranking else None,
        )
        if tick:
            tick(1)
        return answered

    for dialogue in conversations:
        await replay_dialogue(dialogue, step)
    return result, plans
