"""Query strategies: the documented search inputs of each mode on a tiny dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.modes import QueryStrategy, plan_turn
from tests.unit.evaluation.test_dataset import write_dataset

pytestmark = pytest.mark.anyio


async def test_strategies_build_the_documented_queries(tmp_path: Path) -> None:
    turn = load_dataset(write_dataset(tmp_path / "tiny")).turns[1]
    embedder = HashingEmbedder()
    append = await plan_turn(turn, QueryStrategy("append"), embedder, None)
    assert append.text == "How do I export my workspace? How long is it kept?"
    gold = await plan_turn(turn, QueryStrategy("condense_gold"), embedder, None)
    assert gold.text == "How long is data kept?"
    blend = await plan_turn(turn, QueryStrategy("blend", 0.7, 6), embedder, None)
    assert blend.text == turn.query and blend.embedding_inputs == 2
    rewrite = ScriptedLLM('{"standalone_query": "How long is exported data kept?"}')
    condensed = await plan_turn(turn, QueryStrategy("condense_llm"), embedder, rewrite)
    assert condensed.text == "How long is exported data kept?" and condensed.llm_calls == 1
    failing = await plan_turn(turn, QueryStrategy("condense_llm"), embedder, ScriptedLLM("no"))
    assert failing.failure == "bad_body" and failing.vector is None
