"""The benchmarks' result writer (`benchmarks/provenance.py`): every result file says which
commit, command and machine it measured, and named configurations share one file. A result
from a work tree with uncommitted changes is refused unless the operator opts in, and the
command recorded starts with the service settings it ran with.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from chatqna.evaluation.provenance import DirtyWorkTree
from chatqna.settings import variables_set

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"


@pytest.fixture(scope="module")
def provenance() -> ModuleType:
    path = BENCHMARKS / "provenance.py"
    spec = importlib.util.spec_from_file_location("provenance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No service setting in the environment, so a recorded command is the typed one."""
    for name in variables_set():
        monkeypatch.delenv(name)
    monkeypatch.delenv("CHATQNA_BENCH_ALLOW_DIRTY", raising=False)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def changed_checkout(
    provenance: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """The writer pointed at a checkout whose one tracked file has changed since HEAD."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "bench.py").write_text("print('measure')\n")
    git(repo, "init", "--quiet")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "one")
    (repo / "bench.py").write_text("print('measure faster')\n")
    monkeypatch.setattr(provenance, "REPO", repo)
    return repo


@pytest.mark.usefixtures("no_settings")
def test_a_result_is_stamped_with_commit_command_and_machine(
    provenance: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MULTI_TURN_BLEND_ENABLED", "true")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    output = tmp_path / "turn_latency.json"
    argv = [str(BENCHMARKS / "turn_latency.py"), "--repeat", "3"]
    # This work tree may hold uncommitted changes while it is being worked on.
    provenance.write_result(
        output, {"machine": {"onnxruntime": "1.0"}, "rows": [1]}, argv=argv, allow_dirty=True
    )
    written = json.loads(output.read_text())
    head = git(REPO, "rev-parse", "HEAD")
    assert written["measured_at_commit"].removesuffix("+dirty") == head
    assert written["command"] == (
        "MULTI_TURN_BLEND_ENABLED=true python benchmarks/turn_latency.py --repeat 3"
    )
    machine = written["machine"]
    assert len(machine["load_average_1_5_15_min"]) == 3 and machine["cores"] >= 1
    assert machine["onnxruntime"] == "1.0"  # what the script measured of the machine stays
    assert written["date"].endswith("Z") and written["rows"] == [1]


@pytest.mark.usefixtures("no_settings")
def test_a_result_from_a_changed_work_tree_is_refused(
    provenance: ModuleType, changed_checkout: Path, tmp_path: Path
) -> None:
    output = tmp_path / "turn_latency.json"
    with pytest.raises(DirtyWorkTree) as refused:
        provenance.write_result(output, {"rows": [1]}, argv=["x.py"])
    assert "bench.py" in str(refused.value)
    assert "set CHATQNA_BENCH_ALLOW_DIRTY=1" in str(refused.value)
    assert not output.exists()


@pytest.mark.usefixtures("no_settings")
def test_with_the_opt_in_a_changed_work_tree_is_stamped_dirty(
    provenance: ModuleType,
    changed_checkout: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHATQNA_BENCH_ALLOW_DIRTY", "1")
    output = tmp_path / "turn_latency.json"
    provenance.write_result(output, {"rows": [1]}, argv=["x.py"])
    head = git(changed_checkout, "rev-parse", "HEAD")
    assert json.loads(output.read_text())["measured_at_commit"] == f"{head}+dirty"


def test_named_configurations_share_one_file(provenance: ModuleType, tmp_path: Path) -> None:
    output = tmp_path / "index_scale.json"
    for name, rows in [("100k", ["100k"]), ("1m", ["1m"]), ("1m", ["1m again"])]:
        provenance.write_result(
            output, {"rows": rows}, configuration=name, argv=["x.py"], allow_dirty=True
        )
    written = json.loads(output.read_text())
    assert written["benchmark"] == "index_scale"
    assert {name: c["rows"] for name, c in written["configurations"].items()} == {
        "100k": ["100k"],
        "1m": ["1m again"],
    }
    assert all("measured_at_commit" in c for c in written["configurations"].values())


def test_every_committed_result_says_where_it_was_measured() -> None:
    stamped = list(RESULTS.glob("*.json"))
    assert len(stamped) >= 15
    for path in stamped:
        document = json.loads(path.read_text())
        for run in document.get("configurations", {"": document}).values():
            assert run["measured_at_commit"] and run["command"] and run["date"], path.name
