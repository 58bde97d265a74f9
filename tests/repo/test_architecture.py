"""Who may import whom in `chatqna/`: no import cycles, and a pipeline that knows no backend."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "chatqna"
# The pipeline sees backends only through their Protocols, the bundle of live backends and
# the shared vector maths; from retrieval, only the fusion constants.
PIPELINE_MAY_IMPORT = {
    "chatqna.backends.protocols",
    "chatqna.backends.bundle",
    "chatqna.backends.vectors",
    "chatqna.retrieval.fusion",
}


def imports() -> dict[str, set[str]]:
    """Module -> the chatqna modules it imports (at the top or inside a function)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[module] = {m for m in found if m.startswith("chatqna")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target in path:
                found.append([*path[path.index(target) :], target])
            elif target in graph and target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return found


def test_no_module_imports_itself_round_a_cycle() -> None:
    assert cycles(imports()) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_pipeline_imports_no_concrete_backend() -> None:
    graph = imports()
    pipeline = {m: deps for m, deps in graph.items() if m.startswith("chatqna.pipeline")}
    assert pipeline, "the pipeline package was found"
    for module, deps in pipeline.items():
        outside = {
            d
            for d in deps
            if d.startswith(("chatqna.backends", "chatqna.retrieval"))
            and d not in PIPELINE_MAY_IMPORT
        }
        assert outside == set(), module
