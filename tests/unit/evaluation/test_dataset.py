"""Benchmark datasets in the MTRAG layout: loading, history, scored turns, bad lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatqna.evaluation.dataset import EvalTurn, Passage, load_dataset
from chatqna.multiturn.history import Message, split_conversation

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


@pytest.mark.parametrize(
    ("file", "line", "message"),
    [
        ("corpus.jsonl", {"title": "no id", "text": "t"}, r"corpus\.jsonl:4: no 'id'"),
        ("corpus.jsonl", {"id": "x", "text": None}, r"corpus\.jsonl:4: no 'text'"),
        ("conversations.jsonl", {"turns": []}, r"conversations\.jsonl:2: no 'conversation_id'"),
        (
            "conversations.jsonl",
            {"conversation_id": "c2", "turns": [{"role": "user"}]},
            r"conversations\.jsonl:2: no 'text'",
        ),
        (
            "conversations.jsonl",
            {"conversation_id": "c2", "turns": [{"role": "user", "text": "q", "evaluate": True}]},
            r"conversations\.jsonl:2: no 'turn'",
        ),
        (
            "conversations.jsonl",
            {
                "conversation_id": "c2",
                "turns": [
                    {"role": "user", "text": "q", "turn": 1, "evaluate": True, "relevant_ids": 7}
                ],
            },
            r"conversations\.jsonl:2: 'relevant_ids' is not a list",
        ),
    ],
)
def test_a_row_without_a_required_field_names_its_file_and_line(
    tmp_path: Path, file: str, line: dict[str, object], message: str
) -> None:
    directory = write_dataset(tmp_path / "bad")
    with (directory / file).open("a") as stream:
        stream.write(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=message):
        load_dataset(directory)


def test_a_passage_is_indexed_as_ingestion_indexes_a_chunk() -> None:
    passage = Passage("p-1", "Refunds", "Annual plans are refundable.")
    chunk = passage.chunk("corpus", 3)
    assert (chunk.id, chunk.text, chunk.title, chunk.index) == (
        "p-1",
        "Annual plans are refundable.",
        "Refunds",
        3,
    )
    assert passage.indexed_text() == chunk.indexed_text == "Refunds\nAnnual plans are refundable."
    assert passage.chunk("corpus", 3, "none").indexed_text == "Annual plans are refundable."
    assert passage.indexed_text("none") == "Annual plans are refundable."


def test_a_turn_is_split_into_its_conversation_as_the_api_splits_it() -> None:
    history = (
        Message("system", "Be brief."),
        Message("user", "How do I export?"),
        Message("assistant", "Settings > Export."),
    )
    turn = EvalTurn("c1", 2, "After I cancel?", history, ("p1",), None)
    conversation = turn.conversation()
    assert conversation == split_conversation([*history, Message("user", "After I cancel?")])
    assert conversation.query == "After I cancel?"
    assert conversation.history == history[1:] and conversation.system == ("Be brief.",)
