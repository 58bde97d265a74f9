"""The benchmark run end to end on a tiny dataset."""

from __future__ import annotations

import pytest

from chatqna.evaluation.strategies import QueryStrategy
from tests.unit.evaluation.conftest import TinyRun

pytestmark = pytest.mark.anyio


async def test_run_benchmark_on_the_tiny_dataset(run_tiny: TinyRun) -> None:
    results = await run_tiny(
        [QueryStrategy("stateless"), QueryStrategy("condense_gold")],
        samples=50,
    )
    assert len(results["modes"]) == 8
    assert results["dataset"]["turn_1"] == 1 and results["dataset"]["follow_ups"] == 1
    gold = next(
        m
        for m in results["modes"]
        if m["strategy"] == "condense_gold" and m["hybrid"] and not m["rerank"]
    )
    follow = gold["splits"]["follow_ups"]["metrics"]
    # p-missing is not in the corpus: recall tops out at 1/2.
    assert follow["R@10"]["mean"] == 0.5
    assert gold["splits"]["turn_1"]["metrics"]["R@1"]["mean"] == 1.0


async def test_hybrid_modes_fuse_at_the_dense_weight_given(run_tiny: TinyRun) -> None:
    results = await run_tiny(
        [QueryStrategy("stateless")],
        samples=20,
        bm25_weights=(0.2,),
        dense_weight=0.5,
    )
    labels = {mode["label"] for mode in results["modes"]}
    assert "stateless (hybrid dense=0.5 bm25=0.2 x50, no rerank)" in labels
    assert "stateless (dense, no rerank)" in labels  # dense only has no fusion weight
