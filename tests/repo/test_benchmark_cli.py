"""The benchmark scripts' command lines (`benchmarks/*.py`): every option a script's usage
lines show is one its parser takes, and a script that reads a dataset is told where it is
(`--dataset`, its help naming the MTRAG layout; required, unless it defaults to a dataset
kept in `benchmarks/datasets/`), never pointed at a path outside the repository, which a
user's checkout does not have.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
DATASET_OPTIONS = ("--dataset", "--datasets")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# How a path beside the checkout is spelt: the repository's parent, or a sibling folder.
# A dataset kept in the repository, the one default a dataset option may have.
IN_REPO_DATASET = "HERE / 'datasets' / "
OUTSIDE = re.compile(r"REPO\.parent|parents\[2\]|\.\./shared|shared/datasets")


def option_calls(tree: ast.Module) -> dict[str, ast.Call]:
    """Each `add_argument("--name", ...)` of a module, by the option's name."""
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    calls[arg.value] = node
    return calls


def options_taken(tree: ast.Module) -> set[str]:
    taken = set()
    for name, call in option_calls(tree).items():
        taken.add(name)
        if "BooleanOptionalAction" in ast.unparse(call):
            taken.add("--no-" + name.removeprefix("--"))
    return taken


def usage_options(tree: ast.Module) -> set[str]:
    """The options named in the docstring's usage lines (its indented lines)."""
    lines = (ast.get_docstring(tree) or "").splitlines()
    return {option for line in lines if line.startswith("    ") for option in OPTION.findall(line)}


def dataset_problems(tree: ast.Module) -> list[str]:
    """How a script's dataset option falls short: optional without a dataset of the
    repository as its default, or a help that does not say what it reads."""
    problems = []
    for name, call in option_calls(tree).items():
        if name not in DATASET_OPTIONS:
            continue
        keywords = {keyword.arg: keyword.value for keyword in call.keywords}
        required = keywords.get("required")
        default = ast.unparse(keywords["default"]) if "default" in keywords else None
        if default is None:
            if not (isinstance(required, ast.Constant) and required.value is True):
                problems.append(f"{name} is neither required nor given a default")
        elif not default.startswith(IN_REPO_DATASET):
            problems.append(f"{name} defaults to {default}, not a dataset of the repository")
        text = ast.unparse(keywords["help"]) if "help" in keywords else ""
        for needed in ("MTRAG", "corpus.jsonl", "conversations.jsonl", "Getting the datasets"):
            if needed not in text:
                problems.append(f"{name}'s help does not say {needed!r}")
    return problems


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_option_in_the_usage_lines_is_taken(script: Path) -> None:
    tree = ast.parse(script.read_text())
    assert usage_options(tree) - options_taken(tree) == set()


def test_a_script_that_reads_a_dataset_is_told_where_it_is() -> None:
    trees = {script.name: ast.parse(script.read_text()) for script in SCRIPTS}
    readers = {
        name for name, tree in trees.items() if set(option_calls(tree)) & set(DATASET_OPTIONS)
    }
    assert {"blend_cost.py", "dense_recall.py", "rerank_query.py"} <= readers
    problems = {name: dataset_problems(trees[name]) for name in sorted(readers)}
    assert {name: found for name, found in problems.items() if found} == {}


def test_no_benchmark_points_outside_the_repository() -> None:
    """Result files record the commands they ran (`results/`), so only the scripts and
    the datasets' notes are read."""
    sources = [*SCRIPTS, *(BENCHMARKS / "datasets").rglob("*.md")]
    outside = {
        path.relative_to(REPO).as_posix(): OUTSIDE.findall(path.read_text()) for path in sources
    }
    assert {path: found for path, found in outside.items() if found} == {}
