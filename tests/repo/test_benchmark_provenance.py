"""The benchmarks' result writer (`benchmarks/provenance.py`): every result file says which
commit, command and machine it measured, and named configurations share one file. A run
from a work tree with uncommitted changes is refused when it starts unless the operator
opts in; one whose work tree changes while it runs keeps the commit it started at; and the
command recorded starts with the service settings it ran with.

The rule for the committed results: each JSON file under `benchmarks/results/` (in every
subdirectory) records, for each of its runs, the commit measured (HEAD's id, `+dirty` only
when the operator opted in), the command that ran (`chatqna bench ...` or
`python benchmarks/<script>.py ...`, after the settings it ran with), the machine and the
date, as the writer stamps them; a provenance filled in afterwards (`provenance_note`) is
not a measured one. Each script that writes a result has exactly one current file.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from chatqna.evaluation.provenance import DirtyWorkTree
from chatqna.settings import variables_set
from tests.unit.evaluation.conftest import git

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"

# Files whose provenance predates the writer: a commit and a date filled in from git's
# history (`provenance_note`). Each leaves this list when it is measured again.
RERUN_PENDING: dict[str, str] = {}

COMMIT = re.compile(r"[0-9a-f]{40}(\+dirty)?")
DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
SCRIPT = re.compile(r"(?:^|\s)python (benchmarks/[a-z0-9_]+\.py)(?:\s|$)")
BENCH = re.compile(r"(?:^|\s)chatqna bench(?:\s|$)")


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


@pytest.fixture
def clean_checkout(provenance: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The writer pointed at a checkout of one commit, no run of it started yet."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "bench.py").write_text("print('measure')\n")
    git(repo, "init", "--quiet")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "one")
    monkeypatch.setattr(provenance, "REPO", repo)
    monkeypatch.setattr(provenance, "_started", {})
    return repo


@pytest.fixture
def changed_checkout(clean_checkout: Path) -> Path:
    """The writer pointed at a checkout whose one tracked file has changed since HEAD."""
    (clean_checkout / "bench.py").write_text("print('measure faster')\n")
    return clean_checkout


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


@pytest.mark.usefixtures("no_settings")
def test_a_run_from_a_changed_work_tree_is_refused_when_it_starts(
    provenance: ModuleType, changed_checkout: Path
) -> None:
    with pytest.raises(DirtyWorkTree, match=r"bench\.py"):
        provenance.start_run()


@pytest.mark.usefixtures("no_settings")
@pytest.mark.parametrize("change", ["edit", "commit"])
def test_a_work_tree_changed_during_the_run_keeps_the_commit_it_started_at(
    provenance: ModuleType,
    clean_checkout: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: str,
) -> None:
    started = provenance.start_run()
    assert started == git(clean_checkout, "rev-parse", "HEAD")
    (clean_checkout / "bench.py").write_text("print('measure faster')\n")
    if change == "commit":
        git(clean_checkout, "commit", "--quiet", "-am", "two")
    output = tmp_path / "turn_latency.json"
    provenance.write_result(output, {"rows": [1]}, argv=["x.py"])
    assert json.loads(output.read_text())["measured_at_commit"] == started
    warning = capsys.readouterr().err
    assert "the work tree changed during the run" in warning
    assert ("HEAD moved" if change == "commit" else "bench.py") in warning


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


def result_files() -> dict[str, dict[str, Any]]:
    """Every JSON result under `benchmarks/results/`, subdirectories too, by relative path."""
    return {
        path.relative_to(RESULTS).as_posix(): json.loads(path.read_text())
        for path in sorted(RESULTS.rglob("*.json"))
    }


def runs(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A file's runs: its named configurations, or the file itself."""
    configurations: dict[str, dict[str, Any]] = document.get("configurations", {"": document})
    return configurations


def breaks_the_rule(run: dict[str, Any], document: dict[str, Any]) -> list[str]:
    """How one run of `document` falls short of the provenance the writer stamps."""
    command = run.get("command")
    problems = [
        f"{key} {run.get(key)!r}"
        for key, shape in (("measured_at_commit", COMMIT), ("date", DATE))
        if not (isinstance(run.get(key), str) and shape.fullmatch(run[key]))
    ]
    if not (isinstance(command, str) and (SCRIPT.search(command) or BENCH.search(command))):
        problems.append(f"command {command!r} names no benchmark")
    if not isinstance(run.get("machine"), dict):
        problems.append("no machine")
    if "provenance_note" in run or "provenance_note" in document:
        problems.append("provenance filled in after the run")
    return problems


def test_every_result_says_where_it_was_measured() -> None:
    files = result_files()
    assert len(files) >= 20
    flagged = {}
    for name, document in files.items():
        problems = [
            f"{configuration or 'file'}: {problem}"
            for configuration, run in runs(document).items()
            for problem in breaks_the_rule(run, document)
        ]
        if problems:
            flagged[name] = problems
    assert {name: p for name, p in flagged.items() if name not in RERUN_PENDING} == {}
    measured_again = set(RERUN_PENDING) - set(flagged)
    assert not measured_again, f"measured again: take {measured_again} off RERUN_PENDING"


def benchmark_scripts() -> set[str]:
    """The scripts that write a result: every script that calls `write_result`, the writer
    itself aside."""
    return {
        path.relative_to(REPO).as_posix()
        for path in BENCHMARKS.glob("*.py")
        if path.name != "provenance.py" and "write_result(" in path.read_text()
    }


def _reads_arguments(statement: ast.stmt) -> bool:
    """Whether `statement` of a `main` only builds or reads its command line (or imports)."""
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return True
    text = ast.unparse(statement)
    return text.startswith(("parser = ", "parser.add_argument(", "args = ")) and (
        "parse_args(" in text or "ArgumentParser(" in text or "add_argument(" in text
    )


def work_before_start(source: str) -> list[str] | None:
    """What a script's `main` runs before `start_run()`, other than reading its arguments;
    None when `main` never calls it."""
    main = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main"
    )
    for index, statement in enumerate(main.body):
        if ast.unparse(statement) == "start_run()":
            before = main.body[:index]
            return [ast.unparse(s) for s in before if not _reads_arguments(s)]
    return None


def test_every_benchmark_script_takes_its_commit_before_it_measures() -> None:
    """Checked when the run starts, the work tree refuses a run before hours are spent on
    it, and the commit stamped is the one whose code the run loaded."""
    late = {
        script: work_before_start((REPO / script).read_text()) for script in benchmark_scripts()
    }
    assert {script: work for script, work in late.items() if work != []} == {}


def test_every_benchmark_script_has_exactly_one_current_result() -> None:
    files_of: dict[str, set[str]] = defaultdict(set)
    for name, document in result_files().items():
        for run in runs(document).values():
            found = SCRIPT.search(str(run.get("command")))
            if found:
                files_of[found.group(1)].add(name)
    scripts = benchmark_scripts()
    assert len(scripts) >= 19
    not_one = {script: sorted(files_of[script]) for script in scripts if len(files_of[script]) != 1}
    assert not_one == {}, "each script has exactly one current result file"
    assert set(files_of) <= scripts, set(files_of) - scripts
