"""The benchmarks' result writer (`benchmarks/provenance.py`): every result file says which
commit, command and machine it measured, and named configurations share one file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def provenance() -> ModuleType:
    path = REPO / "benchmarks" / "provenance.py"
    spec = importlib.util.spec_from_file_location("provenance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_result_is_stamped_with_commit_command_and_machine(
    provenance: ModuleType, tmp_path: Path
) -> None:
    output = tmp_path / "turn_latency.json"
    argv = [str(REPO / "benchmarks" / "turn_latency.py"), "--repeat", "3"]
    provenance.write_result(output, {"machine": {"onnxruntime": "1.0"}, "rows": [1]}, argv=argv)
    written = json.loads(output.read_text())
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert written["measured_at_commit"].removesuffix("+dirty") == head
    assert written["command"] == "python benchmarks/turn_latency.py --repeat 3"
    machine = written["machine"]
    assert machine["cores"] == os.cpu_count() and len(machine["load_average_1_5_15_min"]) == 3
    assert machine["onnxruntime"] == "1.0"  # what the script measured of the machine stays
    assert written["date"].endswith("Z") and written["rows"] == [1]


def test_named_configurations_share_one_file(provenance: ModuleType, tmp_path: Path) -> None:
    output = tmp_path / "index_scale.json"
    provenance.write_result(output, {"rows": ["100k"]}, configuration="100k", argv=["x.py"])
    provenance.write_result(output, {"rows": ["1m"]}, configuration="1m", argv=["x.py"])
    provenance.write_result(output, {"rows": ["1m again"]}, configuration="1m", argv=["x.py"])
    written = json.loads(output.read_text())
    assert written["benchmark"] == "index_scale"
    assert {name: c["rows"] for name, c in written["configurations"].items()} == {
        "100k": ["100k"],
        "1m": ["1m again"],
    }
    assert all("measured_at_commit" in c for c in written["configurations"].values())


def test_every_committed_result_says_where_it_was_measured() -> None:
    stamped = list((REPO / "benchmarks" / "results").glob("*.json"))
    assert len(stamped) >= 15
    for path in stamped:
        document = json.loads(path.read_text())
        for run in document.get("configurations", {"": document}).values():
            assert run["measured_at_commit"] and run["command"] and run["date"], path.name
