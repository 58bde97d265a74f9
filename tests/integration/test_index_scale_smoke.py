"""The index scale benchmark, run at a toy size so it keeps working: the embedded index
exact and with its graph forced on, the reopen in a fresh process, JSON out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, clean_env

pytestmark = pytest.mark.slow

SCRIPT = REPO / "benchmarks" / "index_scale.py"


def test_index_scale_times_the_exact_and_the_graph_paths(tmp_path: Path) -> None:
    output = tmp_path / "scale.json"
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--sizes",
            "1200",
            "--queries",
            "5",
            "--batch",
            "300",
            "--no-redis",
            "--graph",
            "--tmp-dir",
            str(tmp_path),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["index"]: r for r in json.loads(output.read_text())["rows"]}
    exact, graph = rows["embedded (1 call)"], rows["embedded + HNSW graph (1 call)"]
    assert exact["dense_search"].startswith("int8 scan")
    assert exact["dense_recall_at_k_vs_exact"] == 1.0
    assert exact["reopen_s"] > 0 and exact["reopen_rss_bytes"] > 0
    assert graph["dense_search"].startswith("usearch HNSW")
    assert graph["hybrid_results_min"] == 10
    assert rows["embedded (one more call)"]["call_chunks"] == 300
    assert "a fresh process opens it" in run.stdout
