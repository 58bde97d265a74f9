"""The load benchmark script, run for seconds so it keeps working: a warm-up and two short
runs, JSON out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, clean_env

pytestmark = pytest.mark.slow

SCRIPT = REPO / "benchmarks" / "load_chats.py"


def test_load_benchmark_runs_twice_against_one_server(tmp_path: Path) -> None:
    output = tmp_path / "load.json"
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--concurrency",
            "4",
            "--duration",
            "1",
            "--runs",
            "2",
            "--ramp",
            "0.2",
            "--pause",
            "0.2",
            "--warmup",
            "0.5",
            "--output",
            str(output),
        ],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| run | chats | chats/s |" in run.stdout
    report = json.loads(output.read_text())
    assert report["concurrency"] == 4 and len(report["runs"]) == 2
    for measured in report["runs"]:
        assert measured["errors"] == 0, measured["errors_by_kind"]
        assert measured["chats_ok"] > 0 and measured["conversations_ok"] > 0
        assert measured["chats_per_s"] > 0
        first_event, first_token, latency = (
            measured[key]["p50"] for key in ("first_event_ms", "first_token_ms", "latency_ms")
        )
        assert 0 < first_event <= first_token <= latency
        rss = measured["server_rss_mib"]
        assert 0 < rss["start"] <= rss["peak"] and rss["end"] <= rss["peak"]
    assert len(report["rss_end_mib_by_run"]) == 2
    assert report["warmup"]["chats_ok"] > 0
    settled = report["rss_settled_mib_by_run"]
    assert len(settled) == 2 and all(mib > 0 for mib in settled)
    assert report["rss_settled_growth_mib"] == [round(settled[1] - settled[0], 1)]
    assert "settled RSS growth from run to run (MiB):" in run.stdout
    assert report["rss_settled_trend_mib_per_run"] is None  # a trend needs three runs
