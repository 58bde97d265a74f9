"""The harness's comparison of the configured defaults with stateless, the seed blend and gold."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.backends.protocols import Completion, GenerationParams
from chatqna.evaluation.compare import (
    SEED_BLEND,
    comparison_markdown,
    condense_strategy,
    default_strategy,
    shipped_references,
)
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.modes import plan_turn
from chatqna.evaluation.strategies import QueryStrategy, default_strategies
from chatqna.multiturn.strategy import MultiTurnConfig, build_strategy
from chatqna.retrieval.fusion import FUSION_CANDIDATES
from chatqna.settings import Settings
from tests.unit.evaluation.conftest import TinyRun, blend
from tests.unit.evaluation.test_dataset import write_dataset

pytestmark = pytest.mark.anyio

SETTINGS = Settings(
    multi_turn_blend_alpha=0.75,
    multi_turn_history_turns=4,
    multi_turn_history_order="newest_first",
    multi_turn_history_roles="user_assistant",
    multi_turn_bm25_history_weight=0.3,
    multi_turn_self_contained_similarity=0.5,
    rrf_bm25_weight=0.2,
)


def test_references_follow_the_settings_and_the_seed() -> None:
    references = {r.name: r for r in shipped_references(SETTINGS, depth=10)}
    assert len(references) == 10
    default = references["default blend"]
    assert default.under_test and not default.mode.rerank
    assert default.mode.query == blend(
        alpha=0.75,
        history_turns=4,
        history_order="newest_first",
        bm25_history_weight=0.3,
        self_contained_similarity=0.5,
    )
    assert default.mode.fusion_weights == (1.0, 0.2)
    assert default.mode.candidates == FUSION_CANDIDATES
    stateless = references["stateless"].mode
    assert stateless.query.strategy == "stateless" and stateless.fusion_weights == (1.0, 0.2)
    assert not references["stateless, dense only"].mode.hybrid
    seed = references["seed blend"].mode
    assert seed.query == SEED_BLEND and seed.fusion_weights == (1.0, 1.0)
    assert seed.candidates == 10  # the seed fused each leg's best k
    assert references["gold rewrite, rerank"].mode.rerank
    message = SETTINGS.model_copy(update={"multi_turn_rerank_query": "message"})
    assert default_strategy(message).config.rerank_query == "message"


def test_the_default_blend_plans_with_the_config_the_service_builds() -> None:
    served = SETTINGS.model_copy(update={"multi_turn_blend_enabled": True})
    assert default_strategy(SETTINGS).config == MultiTurnConfig.from_settings(served)


def test_the_default_blend_is_the_grids_blend_of_the_same_values() -> None:
    # A condense setting is no blend value: the row is still the grid's, planned once.
    condensing = SETTINGS.model_copy(
        update={"condense_timeout_seconds": 30.0, "condense_max_query_chars": 90}
    )
    grid = default_strategies(
        MultiTurnConfig.from_settings(condensing),
        alphas=(0.75,),
        history_turns=(4,),
        orders=("newest_first",),
        bm25_history_weights=(0.3,),
        self_contained=(0.5,),
    )
    assert default_strategy(condensing) in grid
    assert condense_strategy(condensing).config.condense_timeout_seconds == 30.0


class SlowLLM(ScriptedLLM):
    """A rewrite model that answers after a second."""

    async def complete(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> Completion:
        await asyncio.sleep(1.0)
        return await super().complete(messages, params)


async def test_the_condense_row_runs_the_services_condense_with_its_settings(
    tmp_path: Path,
) -> None:
    turn = load_dataset(write_dataset(tmp_path / "tiny")).turns[1]
    settings = Settings(
        multi_turn_mode="condense",
        multi_turn_history_turns=1,
        condense_timeout_seconds=0.05,
        condense_max_query_chars=80,
    )
    strategy = condense_strategy(settings)
    assert strategy.config == MultiTurnConfig.from_settings(settings)
    reply = '{"standalone_query": "How long is the exported workspace kept?"}'
    embedder, harness_llm, service_llm = HashingEmbedder(), ScriptedLLM(reply), ScriptedLLM(reply)
    plan = await plan_turn(turn, strategy, embedder, harness_llm)
    served = await build_strategy(
        MultiTurnConfig.from_settings(settings), embedder=embedder, condense_llm=service_llm
    ).plan(turn.conversation())
    assert harness_llm.prompts == service_llm.prompts
    prompt = harness_llm.prompts[0][-1]["content"]
    assert "Use the export zip." in prompt and "How do I export" not in prompt  # one message
    assert plan.service is not None and plan.llm_calls == 1 and plan.embedding_inputs == 1
    assert plan.service.text == served.text == "How long is the exported workspace kept?"
    np.testing.assert_array_equal(plan.service.embedding, served.embedding)
    assert plan.service.rerank.text == served.rerank.text
    slow = await plan_turn(turn, strategy, embedder, SlowLLM(reply))
    assert slow.failure == "timeout" and slow.service is None


async def test_the_blend_bm25_leg_hears_earlier_questions(tmp_path: Path) -> None:
    turn = load_dataset(write_dataset(tmp_path / "tiny")).turns[1]
    plan = await plan_turn(
        turn, blend(history_turns=4, bm25_history_weight=0.3), HashingEmbedder(), None
    )
    assert plan.service is not None and plan.service.history_leg is not None
    leg = plan.service.history_leg
    assert (leg.questions, leg.search_weight) == ("How do I export my workspace?", 0.3)


async def test_comparison_pairs_every_reference_with_the_default(run_tiny: TinyRun) -> None:
    results = await run_tiny(
        [QueryStrategy("stateless")],
        samples=50,
        references=shipped_references(SETTINGS, depth=10),
    )
    comparison = results["comparison"]
    assert comparison["turn_1_identical"] == {"no rerank": True, "rerank": True}
    rows = {row["name"]: row for row in comparison["rows"]}
    assert "default_minus_this" not in rows["default blend"]
    gold = rows["gold rewrite"]["default_minus_this"]["follow_ups"]["R@5"]
    default = rows["default blend"]["follow_ups"]["R@5"]["mean"]
    assert gold["mean"] == pytest.approx(
        default - rows["gold rewrite"]["follow_ups"]["R@5"]["mean"]
    )
    # One conversation: every resample is the same conversation, so the interval is a point.
    assert gold["low"] == gold["high"] == gold["mean"]
    first = rows["stateless"]["default_minus_this"]["turn_1"]["R@5"]
    assert first == {"mean": 0.0, "low": 0.0, "high": 0.0}
    table = "\n".join(comparison_markdown(comparison))
    assert "| seed blend |" in table and "no rerank: True" in table
