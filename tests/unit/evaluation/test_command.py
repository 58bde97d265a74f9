"""`chatqna bench`'s options become one grid; bad values are refused before any model loads."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chatqna import cli
from chatqna.cli import app
from chatqna.evaluation.command import BenchGrid, grid_strategies, run_provenance
from chatqna.evaluation.compare import default_strategy
from chatqna.evaluation.options import SERVICE_DEFAULTS
from chatqna.settings import Settings
from tests.unit.evaluation.conftest import git
from tests.unit.evaluation.test_dataset import write_dataset

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


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("alphas", "0.5,2", "--alphas: 2 is out of range (each is between 0 and 1)"),
        ("alphas", "0.5,x", "--alphas: '0.5,x' is not a comma-separated list of numbers"),
        ("alphas", "nan", "--alphas: nan is out of range"),
        ("history_turns", "-1", "--history-turns: -1 is out of range (each is at least 0)"),
        ("samples", -5, "--samples: -5 is out of range (at least 1)"),
        ("bm25_weights", "-0.1", "--bm25-weights: -0.1 is out of range (each is at least 0)"),
        ("bm25_history_weights", "1.5", "--bm25-history-weights: 1.5 is out of range"),
        ("assistant_weights", "2", "--assistant-weights: 2 is out of range"),
        ("self_contained_similarities", "-1", "--self-contained-similarities: -1 is out of"),
        ("fusion_candidates", "0", "--fusion-candidates: 0 is out of range (each is at least 1)"),
        ("fusion_candidates", "1.5", "--fusion-candidates: '1.5' is not a comma-separated"),
        ("history_order", "oldest", "--history-order: 'oldest' is not one of chronological"),
        ("history_roles", "user,bot", "--history-roles: 'bot' is not one of user_assistant"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_option(
    name: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        BenchGrid.from_options({**OPTIONS, name: value})


def test_the_command_exits_2_without_a_dataset_or_with_a_bad_choice(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["bench"])
    assert missing.exit_code == 2 and "--dataset is required" in missing.output
    bad = runner.invoke(app, ["bench", "--dataset", str(tmp_path), "--history", "mine"])
    assert bad.exit_code == 2 and "--history is reference, own or both" in bad.output


def _refuse_to_build_models(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*arguments: object, **keywords: object) -> None:
        raise AssertionError("the run started, so models would have been built")

    monkeypatch.setattr(cli, "run_bench", fail)


def test_a_bad_range_exits_2_before_any_model_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_to_build_models(monkeypatch)
    dataset = str(write_dataset(tmp_path / "tiny"))
    result = CliRunner().invoke(app, ["bench", "--dataset", dataset, "--alphas", "2"])
    assert result.exit_code == 2
    assert result.stderr == "--alphas: 2 is out of range (each is between 0 and 1)\n"


@pytest.mark.parametrize(
    ("corpus", "message"),
    [
        (None, "corpus.jsonl is missing (a dataset needs both files)"),
        ('{"id": "x", "text": "ok"}\nnot json\n', "corpus.jsonl:2: not JSON"),
        ('{"id": "x", "text": "ok"}\n{"text": "no id"}\n', "corpus.jsonl:2: no 'id'"),
    ],
    ids=["missing-file", "bad-json", "no-id"],
)
def test_a_bad_dataset_exits_2_with_one_line_before_any_model_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus: str | None, message: str
) -> None:
    _refuse_to_build_models(monkeypatch)
    good = write_dataset(tmp_path / "good")
    bad = write_dataset(tmp_path / "bad")
    if corpus is None:
        (bad / "corpus.jsonl").unlink()
    else:
        (bad / "corpus.jsonl").write_text(corpus)
    result = CliRunner().invoke(app, ["bench", "--dataset", str(good), "--dataset", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_a_missing_dataset_directory_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_to_build_models(monkeypatch)
    result = CliRunner().invoke(app, ["bench", "--dataset", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"--dataset {tmp_path / 'nowhere'}: ")


def test_a_run_records_where_it_was_measured(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(checkout)
    head = git(checkout, "rev-parse", "HEAD")
    stamp = run_provenance(head)
    assert stamp["measured_at_commit"] == head
    assert stamp["machine"]["cores"] == os.cpu_count()
    assert len(stamp["machine"]["load_average_1_5_15_min"]) == 3
    assert stamp["date"].endswith("Z")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("change", ["edit", "commit"])
def test_a_work_tree_changed_during_the_run_keeps_the_commit_it_started_at(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    monkeypatch.chdir(checkout)
    started = git(checkout, "rev-parse", "HEAD")
    (checkout / "bench.py").write_text("print('measure faster')\n")
    if change == "commit":
        git(checkout, "commit", "--quiet", "-am", "two")
    assert run_provenance(started)["measured_at_commit"] == started
    warning = capsys.readouterr().err
    assert "the work tree changed during the run" in warning
    assert ("HEAD moved" if change == "commit" else "bench.py") in warning
    assert f"stamped {started[:12]}, the commit the run started from" in warning


def test_a_run_from_a_changed_checkout_is_refused_before_any_model_is_built(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_to_build_models(monkeypatch)
    monkeypatch.delenv("CHATQNA_BENCH_ALLOW_DIRTY", raising=False)
    dataset = str(write_dataset(tmp_path / "tiny"))
    (checkout / "bench.py").write_text("print('measure faster')\n")
    monkeypatch.chdir(checkout)
    result = CliRunner().invoke(app, ["bench", "--dataset", dataset])
    assert result.exit_code == 2
    assert "uncommitted changes (bench.py)" in result.stderr
    assert "set CHATQNA_BENCH_ALLOW_DIRTY=1" in result.stderr


def test_with_the_opt_in_a_changed_checkout_is_measured_as_dirty(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BenchGrid] = []
    monkeypatch.setattr(cli, "configure_logging", lambda _: None)
    monkeypatch.setattr(cli, "run_bench", lambda _s, _d, grid, *_a, **_k: seen.append(grid))
    monkeypatch.setenv("CHATQNA_BENCH_ALLOW_DIRTY", "1")
    monkeypatch.setenv("MULTI_TURN_BLEND_ALPHA", "0.6")
    dataset = str(write_dataset(tmp_path / "tiny"))
    (checkout / "bench.py").write_text("print('measure faster')\n")
    monkeypatch.chdir(checkout)
    # the recorded command is the process's own argv, as a shell started it
    monkeypatch.setattr(sys, "argv", ["chatqna", "bench", "--dataset", dataset])
    result = CliRunner().invoke(app, ["bench", "--dataset", dataset])
    assert result.exit_code == 0, result.output
    (grid,) = seen
    assert grid.measured_at_commit == git(checkout, "rev-parse", "HEAD") + "+dirty"
    assert run_provenance(grid.measured_at_commit)["measured_at_commit"].endswith("+dirty")
    settings, _, arguments = grid.command.partition("chatqna bench ")
    assert "MULTI_TURN_BLEND_ALPHA=0.6" in settings.split() and arguments


def _bare_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]
) -> tuple[BenchGrid, Settings]:
    """The grid and the settings of `chatqna bench --dataset DIR --no-llm` in `environ`."""
    for variable in (*SERVICE_DEFAULTS.values(), "multi_turn_rerank_query"):
        monkeypatch.delenv(variable.upper(), raising=False)
    for variable, value in environ.items():
        monkeypatch.setenv(variable, value)
    seen: list[tuple[BenchGrid, Settings]] = []
    monkeypatch.setattr(cli, "configure_logging", lambda _: None)
    monkeypatch.setattr(cli, "run_bench", lambda s, _d, grid, *_a, **_k: seen.append((grid, s)))
    dataset = str(write_dataset(tmp_path / "tiny"))
    monkeypatch.chdir(tmp_path)  # no checkout: nothing to refuse
    result = CliRunner().invoke(app, ["bench", "--dataset", dataset, "--no-llm"])
    assert result.exit_code == 0, result.output
    ((grid, settings),) = seen
    return grid, settings


SERVICE_ENVIRONMENTS = [
    {},
    {"MULTI_TURN_BLEND_ALPHA": "0.6"},
    {
        "MULTI_TURN_HISTORY_TURNS": "4",
        "MULTI_TURN_HISTORY_ORDER": "chronological",
        "MULTI_TURN_HISTORY_ROLES": "separate",
        "MULTI_TURN_ASSISTANT_WEIGHT": "0.25",
        "MULTI_TURN_BM25_HISTORY_WEIGHT": "0",
        "MULTI_TURN_SELF_CONTAINED_SIMILARITY": "0.5",
        "MULTI_TURN_RERANK_QUERY": "message",
        "RRF_BM25_WEIGHT": "0.5",
    },
]


@pytest.mark.parametrize("environ", SERVICE_ENVIRONMENTS, ids=["shipped", "alpha", "every-knob"])
def test_a_bare_run_measures_the_blend_the_service_would_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]
) -> None:
    grid, settings = _bare_run(tmp_path, monkeypatch, environ)
    served = default_strategy(settings)
    config = served.config
    assert grid.alphas == (config.alpha,) and grid.history_turns == (config.history_turns,)
    assert grid.orders == (config.history_order,) and grid.roles == (config.history_roles,)
    assert grid.bm25_history_weights == (config.bm25_history_weight,)
    assert grid.self_contained == (config.self_contained_similarity,)
    assert grid.bm25_weights == (settings.rrf_bm25_weight,)
    blends = [s for s in grid_strategies(settings, grid) if s.strategy == "blend"]
    assert blends == [served]


def test_an_environment_variable_moves_a_bare_run_as_it_moves_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped, _ = _bare_run(tmp_path / "a", monkeypatch, {})
    assert shipped.alphas == (0.7,) and shipped.orders == ("newest_first",)
    assert shipped.bm25_weights == (0.2,) and shipped.bm25_history_weights == (0.3,)
    assert shipped.self_contained == (0.4,) and shipped.history_turns == (2,)
    moved, _ = _bare_run(tmp_path / "b", monkeypatch, {"MULTI_TURN_BLEND_ALPHA": "0.6"})
    assert moved.alphas == (0.6,)
    # The recorded command reproduces the run: the variable that moved it comes first.
    assert moved.command.startswith("MULTI_TURN_BLEND_ALPHA=0.6 chatqna bench ")


def test_a_grid_option_given_is_the_grid_it_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BenchGrid] = []
    monkeypatch.setattr(cli, "configure_logging", lambda _: None)
    monkeypatch.setattr(cli, "run_bench", lambda _s, _d, grid, *_a, **_k: seen.append(grid))
    monkeypatch.setenv("MULTI_TURN_BLEND_ALPHA", "0.6")
    dataset = str(write_dataset(tmp_path / "tiny"))
    monkeypatch.chdir(tmp_path)
    given = ["--alphas", "0.5,0.9", "--history-order", "both", "--bm25-weights", "1"]
    result = CliRunner().invoke(app, ["bench", "--dataset", dataset, *given])
    assert result.exit_code == 0, result.output
    (grid,) = seen
    assert grid.alphas == (0.5, 0.9) and grid.orders == ("chronological", "newest_first")
    assert grid.bm25_weights == (1.0,) and grid.history_turns == (2,)
    assert grid.swept()["alphas"] == "0.5,0.9"
    assert grid.swept()["history_order"] == "chronological,newest_first"
