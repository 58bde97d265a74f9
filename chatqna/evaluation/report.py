"""Benchmark outputs: the JSON document, a Markdown table and a PNG chart.

The headline table has, per retrieval setting, stateless, append, the best blend setting
(by follow-up R@5), condense with the configured LLM and condense with the gold rewrite
(or, scoring a running service, the service under each history kind),
each with turn-1 and follow-up Recall@5 and nDCG@5 and their 95% intervals. The comparison
table sets the configured defaults against stateless, the seed's blend and the gold rewrite
with paired intervals (`chatqna.evaluation.compare`). The full table lists every mode. The
chart shows follow-up R@5 with intervals for the comparison rows (or, without them, the
headline modes).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatqna.evaluation.compare import comparison_markdown, side_by_side_markdown

HEADLINE_STRATEGIES = ("stateless", "append", "blend", "condense_llm", "condense_gold", "service")


def metric(mode: dict[str, Any], split: str, name: str) -> dict[str, float] | None:
    block = mode["splits"].get(split)
    if block is None:
        return None
    value: dict[str, float] | None = block["metrics"].get(name)
    return value


def cell(mode: dict[str, Any], split: str, name: str) -> str:
    value = metric(mode, split, name)
    if value is None:
        return "-"
    return f"{value['mean']:.3f} [{value['low']:.3f}, {value['high']:.3f}]"


def headline(modes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per retrieval setting: one row per strategy; blend is its best grid point
    (`follow_up_rank`)."""

    def switch(mode: dict[str, Any]) -> tuple[str, bool, float, int | None, bool]:
        return (
            mode.get("history", "reference"),
            mode["hybrid"],
            mode.get("bm25_weight", 1.0),
            mode.get("candidates"),
            mode["rerank"],
        )

    rows = []
    for setting in dict.fromkeys(switch(m) for m in modes):
        group = [m for m in modes if switch(m) == setting]
        for strategy in HEADLINE_STRATEGIES:
            candidates = [m for m in group if m["strategy"] == strategy]
            if candidates:
                rows.append(max(candidates, key=follow_up_rank))
    return rows


def follow_up_rank(mode: dict[str, Any]) -> tuple[float, float]:
    """How the best blend setting is chosen: follow-up R@5, ties broken by nDCG@5."""
    recall = metric(mode, "follow_ups", "R@5") or {"mean": 0.0}
    ndcg = metric(mode, "follow_ups", "nDCG@5") or {"mean": 0.0}
    return (round(recall["mean"], 9), ndcg["mean"])


def swept_grid(results: dict[str, Any]) -> list[str]:
    """The grid the run swept, as options, when the results record it: the options the
    command does not give are the service's settings, which it does not show."""
    grid = results.get("grid")
    if not grid:
        return []
    options = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in grid.items())
    return ["", f"Grid: `{options}`"]


def markdown(results: dict[str, Any]) -> str:
    dataset = results["dataset"]
    lines = [
        f"# Multi-turn retrieval benchmark: {dataset['name']}",
        "",
        f"{dataset['passages']} passages, {dataset['conversations']} conversations, "
        f"{dataset['turn_1']} first turns and {dataset['follow_ups']} follow-ups scored; "
        f"rankings of depth {results['depth']}; 95% intervals from "
        f"{results['bootstrap_samples']} cluster-bootstrap samples over conversations.",
        "",
        f"Command: `{results.get('command', '')}`",
        *swept_grid(results),
        "",
        "## Headline",
        "",
        "| mode | turn 1 R@5 | follow-up R@5 | follow-up nDCG@5 | turn 1 nDCG@5 | extra inputs "
        "/ follow-up | LLM calls / turn | added ms / follow-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in headline(results["modes"]):
        cost = mode["cost"]
        costs = (
            "- | - | -"  # a service's embedding and LLM calls are its own
            if mode["strategy"] == "service"
            else f"{cost['embedding_inputs_per_follow_up'] - 1:+.2f} | "
            f"{cost['llm_calls_per_turn']:.2f} | {cost['added_ms_vs_stateless']:+.1f}"
        )
        lines.append(
            f"| {mode['label']} | {cell(mode, 'turn_1', 'R@5')} | "
            f"{cell(mode, 'follow_ups', 'R@5')} | {cell(mode, 'follow_ups', 'nDCG@5')} | "
            f"{cell(mode, 'turn_1', 'nDCG@5')} | {costs} |"
        )
    comparisons = results.get("comparisons") or {}
    if len(comparisons) > 1:
        lines += ["", *side_by_side_markdown(comparisons)]
    if "comparison" in results:
        lines += ["", *comparison_markdown(results["comparison"])]
    if "own" in comparisons and len(comparisons) > 1:
        lines += ["", *comparison_markdown(comparisons["own"], heading="(own history)")]
    lines += [
        "",
        "## Every mode (follow-up turns)",
        "",
        "| mode | R@1 | R@3 | R@5 | R@10 | nDCG@5 | hit@1 | hit@5 | failed turns |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in results["modes"]:
        values = [
            metric(mode, "follow_ups", name)
            for name in ("R@1", "R@3", "R@5", "R@10", "nDCG@5", "hit@1", "hit@5")
        ]
        shown = " | ".join(f"{v['mean']:.3f}" if v else "-" for v in values)
        lines.append(f"| {mode['label']} | {shown} | {mode['cost']['failed_turns']} |")
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any], path: Path) -> None:
    """Follow-up R@5 with 95% intervals: the comparison rows when the run has them (the
    defaults against the references), else the headline modes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comparison = results.get("comparison")
    if comparison:
        rows = comparison["rows"]
        labels = [row["name"] for row in rows]
        values = [row["follow_ups"].get("R@5") or {"mean": 0, "low": 0, "high": 0} for row in rows]
        highlight = [row["under_test"] for row in rows]
    else:
        rows = headline(results["modes"])
        labels = [row["label"] for row in rows]
        values = [
            metric(row, "follow_ups", "R@5") or {"mean": 0, "low": 0, "high": 0} for row in rows
        ]
        highlight = [row["strategy"] == "blend" for row in rows]
    means = [v["mean"] for v in values]
    errors = [[v["mean"] - v["low"] for v in values], [v["high"] - v["mean"] for v in values]]
    figure, axes = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    positions = list(range(len(rows)))[::-1]
    colours = ["#4c72b0" if marked else "#999999" for marked in highlight]
    axes.barh(positions, means, xerr=errors, color=colours, capsize=3)
    axes.set_yticks(positions, labels, fontsize=8)
    axes.set_xlabel("follow-up Recall@5 (95% CI)")
    axes.set_title(f"{results['dataset']['name']}: follow-up turns")
    axes.set_xlim(0, 1)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def render_from(results_json: Path) -> dict[str, Path]:
    """Redraw `results.md` and the chart next to an existing `results.json`."""
    results = json.loads(results_json.read_text())
    if not (
        isinstance(results, dict)
        and isinstance(results.get("dataset"), dict)
        and isinstance(results.get("modes"), list)
    ):
        raise ValueError(f"{results_json} is not the results.json of `chatqna bench`")
    directory = results_json.parent
    paths = {"markdown": directory / "results.md"}
    paths["markdown"].write_text(markdown(results))
    if chart_available():
        paths["chart"] = directory / "follow_up_recall5.png"
        chart(results, paths["chart"])
    else:
        print(CHART_MISSING.format(json=results_json), file=sys.stderr)
    return paths


CHART_MISSING = (
    "chart not drawn: matplotlib is not installed (pip install 'chatqna[bench]', or "
    "scripts/setup-venv test); redraw it later with `chatqna bench --render {json}`"
)


def chart_available() -> bool:
    """Whether the chart library (the `bench` extra) can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_outputs(results: dict[str, Any], directory: Path) -> dict[str, Path]:
    """Write the JSON and the Markdown, and the chart when matplotlib is installed (a
    missing chart library is reported on stderr, never an error: the figures are written)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"json": directory / "results.json", "markdown": directory / "results.md"}
    paths["json"].write_text(json.dumps(results, indent=1) + "\n")
    paths["markdown"].write_text(markdown(results))
    if chart_available():
        paths["chart"] = directory / "follow_up_recall5.png"
        chart(results, paths["chart"])
    else:
        print(CHART_MISSING.format(json=paths["json"]), file=sys.stderr)
    return paths
