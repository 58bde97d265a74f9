"""Own history: the turn-by-turn replay that puts the system's own answers in the history."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import HashingEmbedder, RecordingReranker, ScriptedLLM
from chatqna.backends.protocols import GenerationParams
from chatqna.documents import ScoredChunk
from chatqna.evaluation.command import served_answer_options
from chatqna.evaluation.compare import default_strategy, shipped_references
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.live import (
    ANSWER_CHARS,
    Answerer,
    dialogues,
    llm_answerer,
    passage_answerer,
    replay_mode,
    retrieve,
)
from chatqna.evaluation.modes import Mode, plan_turn
from chatqna.evaluation.report import markdown
from chatqna.evaluation.runner import build_index
from chatqna.evaluation.strategies import QueryStrategy
from chatqna.multiturn.history import Conversation, Message
from chatqna.pipeline.orchestrator import Pipeline
from chatqna.pipeline.turn import TurnOptions
from chatqna.settings import Settings
from tests.unit.evaluation.conftest import TinyRun, blend
from tests.unit.evaluation.test_dataset import write_dataset

pytestmark = pytest.mark.anyio

BOTH_ROLES = blend(history_turns=4, history_order="newest_first")


def test_dialogues_rebuild_each_conversation_up_to_its_last_scored_turn(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    (dialogue,) = dialogues(dataset, dataset.scored_turns)
    assert [m.role for m in dialogue.messages] == ["user", "assistant", "user"]
    assert {position: t.turn for position, t in dialogue.scored.items()} == {0: 1, 2: 2}


async def test_own_history_holds_the_top_passage_not_the_reference_answer(
    tmp_path: Path,
) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    embedder = HashingEmbedder()
    index = await build_index(dataset, embedder, tmp_path / "index")
    seen: list[Conversation] = []
    texts = {p.id: p.text for p in dataset.passages}
    proxy = passage_answerer(texts)

    async def answer(conversation: Conversation, hits: Sequence[ScoredChunk]) -> str:
        seen.append(conversation)
        return await proxy.write(conversation, hits)

    mode = Mode(BOTH_ROLES, True, False, history="own")
    result, plans = await replay_mode(
        mode,
        dialogues(dataset, dataset.scored_turns),
        index,
        embedder,
        None,
        None,
        Answerer(answer),
    )
    first, second = seen
    assert first.history == ()
    top = result.rankings["c1<::>1"][0]
    assert second.history[0].content == "How do I export my workspace?"
    assert second.history[1].content == texts[top][:ANSWER_CHARS]
    assert second.history[1].content != "Use the export zip."
    assert set(result.per_turn) == {"c1<::>1", "c1<::>2"}
    assert plans["c1<::>2"].service is not None


async def test_own_history_leaves_turn_one_and_stateless_as_with_reference(
    run_tiny: TinyRun,
) -> None:
    results = await run_tiny(
        [QueryStrategy("stateless"), BOTH_ROLES],
        samples=20,
        histories=("reference", "own"),
    )
    by = {(m["label"], m["history"]): m for m in results["modes"]}
    for label, history in list(by):
        if history != "own":
            continue
        own = by[(label, history)]["per_turn_R@5"]
        reference = by[(label.removesuffix(" [own history]"), "reference")]["per_turn_R@5"]
        assert own["c1<::>1"] == reference["c1<::>1"]
        if label.startswith("stateless"):
            assert own == reference
    assert len(results["modes"]) == 2 * 2 * 4


async def test_passage_answer_is_empty_without_hits() -> None:
    answer = passage_answerer({})
    assert await answer.write(Conversation("q", ()), []) == ""


async def test_the_report_sets_reference_and_own_history_side_by_side(run_tiny: TinyRun) -> None:
    results = await run_tiny(
        [QueryStrategy("stateless")],
        samples=20,
        histories=("reference", "own"),
        references=shipped_references(Settings(rrf_bm25_weight=0.2), depth=10),
    )
    assert set(results["comparisons"]) == {"reference", "own"}
    assert all(results["comparisons"]["own"]["turn_1_identical"].values())
    text = markdown({**results, "command": "test"})
    assert "## Reference history and own history, side by side" in text
    assert "## The defaults against the references (own history)" in text


async def test_with_an_llm_own_history_holds_its_answers_as_the_service_makes_them(
    tmp_path: Path,
) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    embedder = HashingEmbedder()
    index = await build_index(dataset, embedder, tmp_path / "index")
    llm = ScriptedLLM("Zip it from the export page.")
    # The service these settings configure plans as BOTH_ROLES and retrieves as the mode.
    settings = Settings(
        multi_turn_blend_enabled=True,
        multi_turn_history_turns=4,
        multi_turn_bm25_history_weight=0.0,
        multi_turn_self_contained_similarity=0.0,
        rrf_bm25_weight=1.0,
        retriever_k=3,
        rerank_top_n=2,
        llm_max_tokens=40,
    )
    options = served_answer_options(settings)
    result, _ = await replay_mode(
        Mode(BOTH_ROLES, True, False, history="own"),
        dialogues(dataset, dataset.scored_turns),
        index,
        embedder,
        None,
        None,
        llm_answerer(llm, options),
    )
    first_prompt, second_prompt = llm.prompts
    assert "[2] " in first_prompt[0]["content"] and "[3] " not in first_prompt[0]["content"]
    assert first_prompt[-1] == {"role": "user", "content": "How do I export my workspace?"}
    # The second turn's history holds the LLM's own answer, not the reference one.
    assert {"role": "assistant", "content": "Zip it from the export page."} in second_prompt
    assert llm.params[0] == GenerationParams(max_tokens=40, temperature=0.0)
    assert set(result.per_turn) == {"c1<::>1", "c1<::>2"}
    # Each prompt is the one the service builds for the same conversation.
    pipeline = Pipeline.build(settings, Backends(embedder, index, None, llm, llm))
    for prompt in (first_prompt, second_prompt):
        messages = [Message(m["role"], m["content"]) for m in prompt[1:]]
        turn = await pipeline.prepare(messages, options)
        assert turn.prompt == prompt
        await turn.close()


@pytest.mark.parametrize("rerank", [False, True])
@pytest.mark.parametrize(("k", "top_n"), [(10, 10), (3, 2)])
async def test_the_harness_ranks_a_turn_as_the_pipeline_serves_it(
    tmp_path: Path, rerank: bool, k: int, top_n: int
) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    embedder = HashingEmbedder()
    index = await build_index(dataset, embedder, tmp_path / "index")
    settings = Settings(multi_turn_blend_enabled=True, rrf_bm25_weight=0.2)
    served, harness = RecordingReranker(), RecordingReranker()
    llm = ScriptedLLM("ok")
    backends = Backends(embedder, index, served if rerank else None, llm, llm)
    pipeline = Pipeline.build(settings, backends)
    strategy = default_strategy(settings)
    mode = Mode(strategy, True, rerank, bm25_weight=0.2)
    options = TurnOptions.from_settings(
        settings, k=k, top_n=top_n, params=GenerationParams(max_tokens=8)
    )
    planned = []
    for turn in dataset.scored_turns:
        messages = [*turn.history, Message("user", turn.query)]
        prepared = await pipeline.prepare(messages, options)
        plan = await plan_turn(turn, strategy, embedder, None)
        ranked = await retrieve(mode, plan, index, harness, options.k, options.top_n)
        assert [h.chunk.id for h in ranked] == [h.chunk.id for h in prepared.sources]
        assert len(ranked) == min(top_n, len(dataset.passages))
        planned.append(prepared.record().plan.strategy)
        await prepared.close()
    # A first turn, then a follow-up the blend plans (with its own rerank query).
    assert planned == ["stateless", "blend"]
    assert served.queries == (harness.queries if rerank else [])
    assert len(served.vectors) == len(harness.vectors)
    for ours, theirs in zip(served.vectors, harness.vectors, strict=True):
        assert ours is not None and theirs is not None
        np.testing.assert_array_equal(ours, theirs)
