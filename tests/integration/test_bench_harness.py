"""The benchmark harness on the handbook lab: in-process modes, and a running service."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, clean_env, start_server
from tests.standins.servers import create_standin_app, serve_in_thread

pytestmark = pytest.mark.slow

LAB = REPO / "benchmarks" / "datasets" / "handbook-lab"
# The grid of a bare run, at the shipped settings (`Settings`' defaults).
SHIPPED_GRID = {
    "alphas": "0.7",
    "history_turns": "2",
    "history_order": "newest_first",
    "history_roles": "user_assistant",
    "assistant_weights": "0.5",
    "bm25_weights": "0.2",
    "bm25_history_weights": "0.3",
    "self_contained_similarities": "0.4",
    "fusion_candidates": "50",
}


def bench(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "chatqna",
            "bench",
            "--dataset",
            str(LAB),
            "--samples",
            "200",
            *args,
        ],
        cwd=REPO,
        # The work tree under test may hold uncommitted changes.
        env=clean_env(CHATQNA_DATA_DIR=str(tmp_path / "data"), CHATQNA_BENCH_ALLOW_DIRTY="1"),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )


def follow_up(mode: dict[str, object], metric: str) -> float:
    splits = mode["splits"]
    assert isinstance(splits, dict)
    return float(splits["follow_ups"]["metrics"][metric]["mean"])


def test_harness_smoke_on_the_handbook_lab(tmp_path: Path) -> None:
    out = tmp_path / "out"
    quick = ("--no-llm", "--output", str(out))  # the grid: the service's settings
    run = bench(*quick, tmp_path=tmp_path)
    assert "## Headline" in run.stdout
    # stderr is a pipe here: progress shows as lines, and no turn is logged at INFO.
    assert "embedding corpus: 36/36 (100%)" in run.stderr
    assert "replaying stateless" not in run.stderr  # stateless reads no answers
    assert any(line.startswith("replaying blend") for line in run.stderr.splitlines())
    assert " INFO chatqna.multiturn" not in run.stderr
    results = json.loads((out / "results.json").read_text())
    assert (out / "results.md").read_text().startswith("# Multi-turn retrieval benchmark")
    assert (out / "follow_up_recall5.png").read_bytes()[:4] == b"\x89PNG"
    assert results["dataset"]["follow_ups"] == 40 and results["dataset"]["turn_1"] == 20
    # stateless, append, blend, gold x 4 switches x reference and own history
    assert len(results["modes"]) == 4 * 4 * 2
    assert "## Reference history and own history, side by side" in run.stdout
    assert results["comparisons"]["own"]["turn_1_identical"] == {"no rerank": True, "rerank": True}
    assert results["settings"]["multi_turn_blend_alpha"] == 0.7
    assert results["machine"]["cores"] >= 1 and "measured_at_commit" in results
    by_label = {m["label"]: m for m in results["modes"]}
    stateless = by_label["stateless (dense, no rerank)"]
    gold = by_label["condense (gold rewrite) (dense, no rerank)"]
    # Hand-written standalone rewrites must beat pronoun-only follow-ups.
    assert follow_up(gold, "R@5") > follow_up(stateless, "R@5")
    # The configured defaults against stateless, the seed blend and the gold rewrite.
    assert "## The defaults against the references" in run.stdout
    comparison = results["comparison"]
    assert comparison["turn_1_identical"] == {"no rerank": True, "rerank": True}
    rows = {row["name"]: row for row in comparison["rows"]}
    assert {"default blend", "stateless", "seed blend", "gold rewrite"} <= set(rows)
    # A bare run's one blend is the service's: the default blend row, ranked alike.
    for name in ("default blend", "default blend, rerank"):
        swept = by_label[rows[name]["label"]]
        assert follow_up(swept, "R@5") == rows[name]["follow_ups"]["R@5"]["mean"]
    assert results["grid"] == SHIPPED_GRID
    # The command shows no grid option, so the report shows the grid it swept.
    assert (
        "Grid: `--alphas 0.7 --history-turns 2 --history-order newest_first"
        in (out / "results.md").read_text()
    )
    versus = rows["stateless"]["default_minus_this"]["follow_ups"]["R@5"]
    assert versus["low"] <= versus["mean"] <= versus["high"]
    # The embedded default keeps the fused order: its "rerank" rows are the retrieval's.
    assert results["reranker"] is None
    for name in ("default blend", "stateless"):
        assert rows[f"{name}, rerank"]["follow_ups"] == rows[name]["follow_ups"]
    # A rerun answers every embedding from the cache, with the similarity reranker too
    # (stored passage vectors, and the plan's vector as its query).
    bench(*quick, "--history", "reference", "--embedded-reranker", "similarity", tmp_path=tmp_path)
    rerun = json.loads((out / "results.json").read_text())
    assert rerun["embedder"]["inputs_computed"] == 0
    assert rerun["reranker"] == "embedding-similarity"


def test_harness_reranks_with_a_tei_compatible_server(tmp_path: Path) -> None:
    out = tmp_path / "tei"
    app = create_standin_app()
    with serve_in_thread(app) as standin:
        quick = ("--no-llm", "--alphas", "0.75", "--history-turns", "4", "--output", str(out))
        bench(*quick, "--reranker-endpoint", standin, tmp_path=tmp_path)
    results = json.loads((out / "results.json").read_text())
    assert results["reranker"] == f"tei:{standin}"
    # Follow-ups of the blend reach the cross-encoder with the newest earlier question.
    lab = [json.loads(line) for line in (LAB / "conversations.jsonl").read_text().splitlines()]
    user = [t["text"] for t in lab[0]["turns"] if t["role"] == "user"]
    assert f"{user[1]}\n{user[0]}" in app.state.rerank_queries
    assert user[1] in app.state.rerank_queries, "stateless turns keep the message"


def test_harness_scores_a_running_service(tmp_path: Path) -> None:
    # The answer is not scored (max_tokens=1), so a stand-in LLM keeps the run short; the
    # embedder, index, reranker and blend are the embedded ones.
    with serve_in_thread(create_standin_app(tokens=1)) as llm:
        server = start_server(
            tmp_path / "served",
            tmp_path / "server.log",
            MULTI_TURN_BLEND_ENABLED="true",
            LLM_ENDPOINT=llm,
            LLM_MODEL_ID="standin",
        )
        try:
            out = tmp_path / "service"
            run = bench(
                "--service", server.url, "--ingest", "--output", str(out), tmp_path=tmp_path
            )
        finally:
            server.stop()
    assert "HTTP Request" not in run.stderr, "a line per request would bury the progress"
    results = json.loads((out / "results.json").read_text())
    reference, own = results["modes"]
    assert (reference["history"], own["history"]) == ("reference", "own")
    for mode in (reference, own):
        assert mode["service_retrieval"]["multi_turn_mode"] == "blend"
        assert mode["splits"]["turn_1"]["metrics"]["R@5"]["mean"] >= 0.9
        assert 0.0 < follow_up(mode, "R@5") <= 1.0
        assert mode["cost"]["failed_turns"] == 0
    # A first turn has no history, so it ranks alike under both.
    first = [key for key in reference["per_turn_R@5"] if key.endswith("<::>1")]
    assert first and all(
        reference["per_turn_R@5"][key] == own["per_turn_R@5"][key] for key in first
    )
