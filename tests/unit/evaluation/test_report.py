"""Benchmark outputs: JSON and Markdown always, the chart only where matplotlib is."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from chatqna.evaluation.report import markdown, render_from, write_outputs

# A real results document: the committed handbook-lab run.
RESULTS: dict[str, Any] = json.loads(
    (
        Path(__file__).resolve().parents[3]
        / "benchmarks"
        / "results"
        / "handbook-lab"
        / "results.json"
    ).read_text()
)


def test_without_matplotlib_the_figures_are_written_and_the_chart_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    paths = write_outputs(RESULTS, tmp_path)
    assert set(paths) == {"json", "markdown"}
    assert json.loads(paths["json"].read_text())["command"] == RESULTS["command"]
    assert paths["markdown"].read_text().startswith("# ")
    assert not (tmp_path / "follow_up_recall5.png").exists()
    message = capsys.readouterr().err
    assert "matplotlib is not installed" in message and "chatqna[bench]" in message
    assert "--render" in message
    assert set(render_from(paths["json"])) == {"markdown"}


def test_with_matplotlib_the_chart_is_drawn(tmp_path: Path) -> None:
    paths = write_outputs(RESULTS, tmp_path)
    assert paths["chart"].read_bytes().startswith(b"\x89PNG")


def test_the_report_shows_the_grid_a_run_swept() -> None:
    assert "Grid: `" not in markdown(RESULTS)  # recorded before runs kept their grid
    grid = {"alphas": "0.7", "history_order": "newest_first", "bm25_weights": "0.2"}
    shown = markdown({**RESULTS, "command": "chatqna bench --dataset lab", "grid": grid})
    assert "Grid: `--alphas 0.7 --history-order newest_first --bm25-weights 0.2`" in shown
