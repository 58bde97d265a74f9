"""The harness's comparison of the configured defaults with stateless, the seed blend and gold."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.evaluation.compare import SEED_BLEND, comparison_markdown, shipped_references
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.modes import QueryStrategy, plan_turn
from chatqna.evaluation.runner import run_benchmark
from chatqna.retrieval.fusion import FUSION_CANDIDATES
from chatqna.settings import Settings
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
    assert default.mode.query == QueryStrategy(
        "blend", 0.75, 4, "newest_first", "user_assistant", 0.3, self_contained=0.5
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


async def test_the_blend_bm25_leg_hears_earlier_questions(tmp_path: Path) -> None:
    turn = load_dataset(write_dataset(tmp_path / "tiny")).turns[1]
    plan = await plan_turn(
        turn, QueryStrategy("blend", 0.7, 4, bm25_history_weight=0.3), HashingEmbedder(), None
    )
    assert plan.bm25_history == "How do I export my workspace?"
    assert plan.bm25_history_weight == 0.3


async def test_comparison_pairs_every_reference_with_the_default(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    embedder = HashingEmbedder()
    results = await run_benchmark(
        dataset,
        [QueryStrategy("stateless")],
        embedder,
        embedder,
        None,
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
