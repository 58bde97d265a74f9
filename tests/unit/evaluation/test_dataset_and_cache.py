"""Dataset loading, the embedding cache, and the query strategies on a tiny dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.evaluation.cache import CachingEmbedder, EmbeddingCache
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.modes import QueryStrategy, plan_turn
from chatqna.evaluation.runner import run_benchmark

pytestmark = pytest.mark.anyio


def write_dataset(directory: Path) -> Path:
    corpus = [
        {"id": "p-export", "title": "Export", "text": "Export your workspace as a zip file."},
        {"id": "p-retain", "title": "Retention", "text": "Data is kept 30 days after cancel."},
        {"id": "p-refund", "title": "Refunds", "text": "Annual plans are refundable."},
    ]
    turns = [
        {
            "turn": 1,
            "role": "user",
            "text": "How do I export my workspace?",
            "relevant_ids": ["p-export"],
            "gold_rewrite": None,
            "evaluate": True,
        },
        {"turn": 1, "role": "assistant", "text": "Use the export zip.", "relevant_ids": []},
        {
            "turn": 2,
            "role": "user",
            "text": "How long is it kept?",
            "relevant_ids": ["p-retain", "p-missing"],
            "gold_rewrite": "How long is data kept?",
            "evaluate": True,
        },
        {"turn": 2, "role": "assistant", "text": "30 days.", "relevant_ids": []},
        {"turn": 3, "role": "user", "text": "not scored", "relevant_ids": [], "evaluate": False},
    ]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "corpus.jsonl").write_text("\n".join(json.dumps(p) for p in corpus) + "\n")
    (directory / "conversations.jsonl").write_text(
        json.dumps({"conversation_id": "c1", "turns": turns}) + "\n"
    )
    return directory


def test_load_dataset_keeps_history_and_scores_only_evaluated_turns(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    assert [p.id for p in dataset.passages] == ["p-export", "p-retain", "p-refund"]
    assert [t.turn for t in dataset.turns] == [1, 2]
    second = dataset.turns[1]
    assert [m.role for m in second.history] == ["user", "assistant"]
    assert second.relevant_ids == ("p-retain", "p-missing")
    assert second.gold_rewrite == "How long is data kept?" and second.is_follow_up
    assert second.key == "c1<::>2"


def test_load_dataset_reports_bad_lines(tmp_path: Path) -> None:
    directory = write_dataset(tmp_path / "bad")
    (directory / "corpus.jsonl").write_text('{"id": "x", "text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=r"corpus\.jsonl:2"):
        load_dataset(directory)
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "nowhere")


async def test_cache_embeds_each_text_once_and_persists(tmp_path: Path) -> None:
    inner = HashingEmbedder()
    cache = EmbeddingCache(tmp_path, inner.name)
    embedder = CachingEmbedder(inner, cache)
    first = await embedder.embed(["a b", "c d", "a b"])
    second = await embedder.embed(["c d"])
    assert inner.batches == [["a b", "c d"]]
    assert embedder.inputs_requested == 4 and embedder.inputs_computed == 2
    np.testing.assert_array_equal(first[1], second[0])
    cache.save()
    reopened = EmbeddingCache(tmp_path, inner.name)
    assert len(reopened) == 2
    np.testing.assert_array_equal(reopened.get("a b"), first[0])
    assert len(EmbeddingCache(tmp_path, "another-model")) == 0


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


async def test_run_benchmark_on_the_tiny_dataset(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    embedder = HashingEmbedder()
    results = await run_benchmark(
        dataset,
        [QueryStrategy("stateless"), QueryStrategy("condense_gold")],
        embedder,
        embedder,
        None,
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
