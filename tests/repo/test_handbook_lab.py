"""The handbook lab benchmark stays consistent with the sample corpus it was written over."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "benchmarks" / "datasets" / "handbook-lab"
SAMPLE_CORPUS = REPO / "chatqna" / "sample_corpus"
ROLES = ["user", "assistant"] * 3


def _load_builder() -> ModuleType:
    # The folder name has a hyphen, so the script cannot be imported as a package module.
    path = LAB / "build_corpus.py"
    spec = importlib.util.spec_from_file_location("handbook_lab_build_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(scope="module")
def corpus() -> list[dict[str, Any]]:
    return _read_jsonl(LAB / "corpus.jsonl")


@pytest.fixture(scope="module")
def conversations() -> list[dict[str, Any]]:
    return _read_jsonl(LAB / "conversations.jsonl")


def _user_turns(conversations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for c in conversations for t in c["turns"] if t["role"] == "user"]


def test_corpus_matches_the_sample_corpus(corpus: list[dict[str, Any]]) -> None:
    builder = _load_builder()
    assert corpus == builder.build_passages(SAMPLE_CORPUS), (
        "corpus.jsonl is stale: rerun benchmarks/datasets/handbook-lab/build_corpus.py"
    )


def test_corpus_ids_are_unique_and_passages_complete(corpus: list[dict[str, Any]]) -> None:
    ids = [p["id"] for p in corpus]
    assert len(ids) == len(set(ids))
    for passage in corpus:
        assert set(passage) == {"id", "title", "text", "domain"}
        assert passage["domain"] == "handbook"
        assert passage["text"].strip()


def test_every_relevant_id_is_in_the_corpus(
    corpus: list[dict[str, Any]], conversations: list[dict[str, Any]]
) -> None:
    ids = {p["id"] for p in corpus}
    missing = {
        (t["task_id"], rid)
        for t in _user_turns(conversations)
        for rid in t["relevant_ids"]
        if rid not in ids
    }
    assert not missing


def test_conversations_have_three_alternating_turns(conversations: list[dict[str, Any]]) -> None:
    assert len(conversations) >= 12
    conversation_ids = [c["conversation_id"] for c in conversations]
    assert len(conversation_ids) == len(set(conversation_ids))
    for conversation in conversations:
        assert conversation["domain"] == "handbook"
        turns = conversation["turns"]
        assert [t["role"] for t in turns] == ROLES, conversation["conversation_id"]
        assert [t["turn"] for t in turns] == [1, 1, 2, 2, 3, 3], conversation["conversation_id"]
        for turn in turns:
            assert turn["text"].strip()
            if turn["role"] == "assistant":
                assert turn["relevant_ids"] == []
                assert turn["gold_rewrite"] is None


def test_task_ids_are_unique_and_well_formed(conversations: list[dict[str, Any]]) -> None:
    task_ids = []
    for conversation in conversations:
        for turn in conversation["turns"]:
            if turn["role"] == "user":
                assert turn["task_id"] == f"{conversation['conversation_id']}<::>{turn['turn']}"
                task_ids.append(turn["task_id"])
    assert len(task_ids) == len(set(task_ids))


def test_every_user_turn_is_evaluated_with_evidence(conversations: list[dict[str, Any]]) -> None:
    for turn in _user_turns(conversations):
        assert turn["evaluate"] is True, turn["task_id"]
        assert turn["relevant_ids"], turn["task_id"]
        assert len(turn["relevant_ids"]) == len(set(turn["relevant_ids"])), turn["task_id"]
        assert isinstance(turn["gold_rewrite"], str) and turn["gold_rewrite"].strip()
        assert turn["answerability"] == "ANSWERABLE"
        assert turn["question_type"]
        if turn["turn"] == 1:
            assert turn["multi_turn"] == "N/A"
            assert turn["gold_rewrite"] == turn["text"]
        else:
            assert turn["multi_turn"] in {"Follow-up", "Topic switch", "Clarification"}


def test_enough_topic_switches(conversations: list[dict[str, Any]]) -> None:
    third_turns = [t for t in _user_turns(conversations) if t["turn"] == 3]
    switches = [t for t in third_turns if t["multi_turn"] == "Topic switch"]
    assert len(switches) >= 5
