"""`chatqna bench`'s options become one grid; bad values are refused before any model loads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chatqna.cli import app
from chatqna.evaluation.command import BenchGrid, run_provenance

OPTIONS: dict[str, Any] = {
    "alphas": "0.6,0.7",
    "history_turns": "2,4",
    "llm": False,
    "samples": 50,
    "cache_dir": Path("cache"),
    "history_order": "both",
    "bm25_weights": "0.2,1",
    "bm25_history_weights": "0,0.3",
    "history_roles": "both",
    "assistant_weights": "0.5",
    "self_contained_similarities": "0,0.4",
    "history": "both",
    "passage_context": "none",
    "fusion_candidates": "10,50",
    "command": "chatqna bench --dataset lab",
}


def test_the_options_become_the_grid() -> None:
    grid = BenchGrid.from_options(OPTIONS)
    assert grid.alphas == (0.6, 0.7) and grid.history_turns == (2, 4)
    assert grid.orders == ("chronological", "newest_first")
    assert grid.roles == ("user_assistant", "user")
    assert grid.histories == ("reference", "own")
    assert grid.bm25_weights == (0.2, 1.0) and grid.bm25_history_weights == (0.0, 0.3)
    assert grid.candidates == (10, 50) and grid.passage_context == "none"
    assert grid.self_contained == (0.0, 0.4)
    assert not grid.with_llm and grid.samples == 50 and grid.cache_dir == Path("cache")
    assert grid.command == "chatqna bench --dataset lab"


def test_one_value_is_kept_as_given() -> None:
    options = {**OPTIONS, "history_order": "newest_first", "history_roles": "user,separate"}
    grid = BenchGrid.from_options({**options, "history": "own"})
    assert grid.orders == ("newest_first",)
    assert grid.roles == ("user", "separate") and grid.histories == ("own",)


@pytest.mark.parametrize(("name", "value"), [("history", "mine"), ("passage_context", "body")])
def test_an_unknown_choice_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="--history is reference, own or both"):
        BenchGrid.from_options({**OPTIONS, name: value})


def test_the_command_exits_2_without_a_dataset_or_with_a_bad_choice(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["bench"])
    assert missing.exit_code == 2 and "--dataset is required" in missing.output
    bad = runner.invoke(app, ["bench", "--dataset", str(tmp_path), "--history", "mine"])
    assert bad.exit_code == 2 and "--history is reference, own or both" in bad.output


def test_a_run_records_where_it_was_measured() -> None:
    stamp = run_provenance()
    commit = stamp["measured_at_commit"]
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0)
    assert stamp["machine"]["cores"] == os.cpu_count()
    assert len(stamp["machine"]["load_average_1_5_15_min"]) == 3
    assert stamp["date"].endswith("Z")
