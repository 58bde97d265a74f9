"""Query strategies: the documented search inputs of each mode on a tiny dataset."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.follow_up_variants.candidates import corpus_idf
from chatqna.evaluation.modes import ANSWER_TERMS_WEIGHT, BenchPlan, CorpusSignals, plan_turn
from chatqna.evaluation.strategies import QueryStrategy
from chatqna.pipeline.sources import search_query
from tests.unit.evaluation.conftest import blend
from tests.unit.evaluation.test_dataset import write_dataset

pytestmark = pytest.mark.anyio
SHIPPED = blend(history_turns=2, history_order="newest_first", bm25_history_weight=0.3)


def varied(strategy: QueryStrategy, **values: Any) -> QueryStrategy:
    """`strategy` with other multi-turn `values`."""
    return replace(strategy, config=replace(strategy.config, **values))


def bm25_history(plan: BenchPlan) -> tuple[str, float]:
    """What the history-aware BM25 leg hears, and at which weight, in the search query."""
    assert plan.service is not None
    query = search_query(plan.service, 10, hybrid=True, fusion_weights=(1.0, 1.0))
    return query.bm25_history, query.bm25_history_weight


async def test_strategies_build_the_documented_queries(tmp_path: Path) -> None:
    turn = load_dataset(write_dataset(tmp_path / "tiny")).turns[1]
    embedder = HashingEmbedder()
    append = await plan_turn(turn, QueryStrategy("append"), embedder, None)
    assert append.service.text == "How do I export my workspace? How long is it kept?"
    gold = await plan_turn(turn, QueryStrategy("condense_gold"), embedder, None)
    assert gold.service.text == "How long is data kept?"
    blended = await plan_turn(turn, blend(), embedder, None)
    assert blended.service.text == turn.query and blended.embedding_inputs == 2
    rewrite = ScriptedLLM('{"standalone_query": "How long is exported data kept?"}')
    condensed = await plan_turn(turn, QueryStrategy("condense_llm"), embedder, rewrite)
    assert condensed.service.text == "How long is exported data kept?" and condensed.llm_calls == 1
    failing = await plan_turn(turn, QueryStrategy("condense_llm"), embedder, ScriptedLLM("no"))
    assert failing.failure == "bad_body" and failing.service is None


async def test_adaptive_candidates_change_only_blended_follow_ups(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    first, follow_up = dataset.turns
    idf = corpus_idf([p.text for p in dataset.passages])
    embedder = HashingEmbedder()
    shipped = SHIPPED
    evidence = replace(shipped, answer_terms=5)
    plan = await plan_turn(follow_up, evidence, embedder, None, signals=CorpusSignals(idf))
    # "Use the export zip.": "export" is in the earlier question, "use" in no passage.
    assert bm25_history(plan) == ("How do I export my workspace?\nzip", 0.3)
    alone = varied(evidence, bm25_history_weight=0.0)
    plan = await plan_turn(follow_up, alone, embedder, None, signals=CorpusSignals(idf))
    assert bm25_history(plan) == ("export zip", ANSWER_TERMS_WEIGHT)
    words = replace(shipped, alpha_rule="content_words")
    adaptive = await plan_turn(follow_up, words, embedder, None)
    fixed = await plan_turn(follow_up, varied(shipped, alpha=2 / 3.5), embedder, None)
    assert adaptive.service.embedding is not None and fixed.service.embedding is not None
    np.testing.assert_allclose(adaptive.service.embedding, fixed.service.embedding)
    baseline = await plan_turn(first, QueryStrategy("stateless"), embedder, None)
    for strategy in (evidence, alone, words):
        planned = await plan_turn(first, strategy, embedder, None, signals=CorpusSignals(idf))
        assert bm25_history(planned) == ("", 0.0)
        assert planned.service.embedding is not None and baseline.service.embedding is not None
        np.testing.assert_array_equal(planned.service.embedding, baseline.service.embedding)
    with pytest.raises(ValueError, match="IDF"):
        await plan_turn(follow_up, evidence, embedder, None)


async def test_the_top_score_alpha_reads_the_follow_ups_own_best_hit(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    first, follow_up = dataset.turns
    embedder = HashingEmbedder()
    searched: list[str] = []

    def top(text: str, vector: np.ndarray) -> float:
        searched.append(text)
        return 0.77

    shipped = SHIPPED
    signals = CorpusSignals(top_score=top)
    adaptive = replace(shipped, alpha_rule="top_score")
    plan = await plan_turn(follow_up, adaptive, embedder, None, signals=signals)
    fixed = await plan_turn(follow_up, varied(shipped, alpha=0.7 + 0.77 - 0.57), embedder, None)
    assert plan.service.embedding is not None and fixed.service.embedding is not None
    np.testing.assert_allclose(plan.service.embedding, fixed.service.embedding, rtol=1e-5)
    assert searched == [follow_up.query]
    opening = await plan_turn(first, adaptive, embedder, None, signals=signals)
    assert searched == [follow_up.query] and bm25_history(opening) == ("", 0.0)
    with pytest.raises(ValueError, match="top-1"):
        await plan_turn(follow_up, adaptive, embedder, None)


async def test_hedging_legs_ride_only_on_blended_follow_ups(tmp_path: Path) -> None:
    first, follow_up = load_dataset(write_dataset(tmp_path / "tiny")).turns
    embedder = HashingEmbedder()
    shipped = SHIPPED
    own = (await embedder.embed([follow_up.query]))[0]
    answer = (await embedder.embed(["Use the export zip."]))[0]
    query_leg = await plan_turn(follow_up, replace(shipped, query_leg_weight=0.5), embedder, None)
    ((vector, share),) = query_leg.dense_legs
    assert share == 0.5 and query_leg.embedding_inputs == 2
    np.testing.assert_allclose(vector, own)
    questions = replace(varied(shipped, history_roles="user"), answer_leg_weight=0.25)
    answer_leg = await plan_turn(follow_up, questions, embedder, None)
    ((vector, share),) = answer_leg.dense_legs
    assert share == 0.25 and answer_leg.embedding_inputs == 3
    np.testing.assert_allclose(vector, answer)
    baseline = await plan_turn(first, QueryStrategy("stateless"), embedder, None)
    for strategy in (replace(shipped, query_leg_weight=1.0), questions):
        opening = await plan_turn(first, strategy, embedder, None)
        assert opening.dense_legs == () and opening.service.embedding is not None
        assert baseline.service.embedding is not None
        np.testing.assert_array_equal(opening.service.embedding, baseline.service.embedding)
