"""Size limits in `chatqna/`: modules under 400 lines, functions under 60, or a stated reason.

A module over the limit carries `# size: <reason>` on a line of its own before its first
statement after the docstring; a function carries it on a line of its signature (from `def`
to the colon). The reason must say something: an empty `# size:` does not count.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "chatqna"
MODULE_LINES = 400
FUNCTION_LINES = 60
REASON = re.compile(r"#\s*size:\s*\S")


def module_reason(lines: list[str], tree: ast.Module) -> bool:
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        first = tree.body[1] if len(tree.body) > 1 else None
    end = first.lineno - 1 if first is not None else len(lines)
    return any(REASON.search(line) for line in lines[:end])


def signature_reason(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body_start = node.body[0].lineno
    return any(REASON.search(line) for line in lines[node.lineno - 1 : body_start - 1])


def oversize(path: Path, root: Path) -> list[str]:
    """The module and functions of `path` over the limits without a stated reason."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    name = path.relative_to(root.parent).as_posix()
    found = []
    if len(lines) > MODULE_LINES and not module_reason(lines, tree):
        found.append(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES and not signature_reason(lines, node):
                found.append(f"{name}:{node.name}")
    return found


def everything_oversize() -> set[str]:
    return {entry for path in PACKAGE.rglob("*.py") for entry in oversize(path, PACKAGE)}


def test_no_module_or_function_is_over_the_limits_without_a_reason() -> None:
    assert everything_oversize() == set()


def write(tmp_path: Path, text: str) -> Path:
    package = tmp_path / "chatqna"
    package.mkdir(exist_ok=True)
    path = package / "sample.py"
    path.write_text(text)
    return path


def long_function(name: str, signature_comment: str = "") -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    return f"def {name}() -> None:{signature_comment}\n{body}"


def test_the_check_finds_a_long_function_and_a_long_module(tmp_path: Path) -> None:
    filler = "".join(f"y{i} = {i}\n" for i in range(MODULE_LINES))
    path = write(tmp_path, '"""Doc."""\n' + long_function("too_long") + filler)
    assert oversize(path, tmp_path / "chatqna") == [
        "chatqna/sample.py",
        "chatqna/sample.py:too_long",
    ]


def test_a_stated_reason_is_accepted_and_an_empty_one_is_not(tmp_path: Path) -> None:
    filler = "".join(f"y{i} = {i}\n" for i in range(MODULE_LINES))
    text = (
        '"""Doc."""\n\n# size: one table of every wire field, read top to bottom\n'
        + long_function("explained", "  # size: one flat state machine")
        + long_function("unexplained", "  # size:")
        + filler
    )
    path = write(tmp_path, text)
    assert oversize(path, tmp_path / "chatqna") == ["chatqna/sample.py:unexplained"]


def test_a_short_function_needs_no_reason(tmp_path: Path) -> None:
    path = write(tmp_path, "def short() -> int:\n    return 1\n")
    assert oversize(path, tmp_path / "chatqna") == []
