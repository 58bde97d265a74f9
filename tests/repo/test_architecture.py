"""Who may import whom in `chatqna/`: the declared map, and no import cycles.

`ALLOWED` is the map that site/docs/architecture.md draws ("Who may import whom"). A key is a
package or a module; a module follows the most specific key that contains it, and may import
that key's own subtree, the shared values, and what the key lists (a package or a module,
with everything under it). Every module of `chatqna/` must fall under some key, so a new
package has to be placed on the map before it can land.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "chatqna"
DOCS = Path(__file__).resolve().parents[2] / "site" / "docs" / "architecture.md"

# Plain values every layer may use: they import nothing else of chatqna's but each other.
SHARED = (
    "chatqna.settings",
    "chatqna.errors",
    "chatqna.documents",
)
ROOT = "chatqna"  # the package itself (`__version__`), importable by every module

ALLOWED: dict[str, tuple[str, ...]] = {
    # Values shared by every layer.
    **{value: SHARED for value in SHARED},
    ROOT: (),
    # Entry points.
    "chatqna.__main__": ("chatqna.cli",),
    "chatqna.cli": (
        "chatqna.app",
        "chatqna.ask",
        "chatqna.composition",
        "chatqna.evaluation",
        "chatqna.ingest",
        "chatqna.logging_setup",
        "chatqna.workers",
    ),
    "chatqna.ask": ("chatqna.upstream.sse", "chatqna.upstream.proxies"),
    "chatqna.app": (
        "chatqna.api",
        "chatqna.composition",
        "chatqna.backends.bundle",
        "chatqna.logging_setup",
        "chatqna.telemetry",
    ),
    # Start-up helpers of the entry points: the log format, the worker processes.
    "chatqna.logging_setup": (),
    "chatqna.workers": (),
    "chatqna.api": (
        "chatqna.pipeline",
        "chatqna.multiturn",
        "chatqna.ingest",
        "chatqna.telemetry",
        "chatqna.backends.protocols",
        "chatqna.backends.bundle",
    ),
    "chatqna.evaluation": (
        "chatqna.composition",
        "chatqna.pipeline",
        "chatqna.multiturn",
        "chatqna.retrieval",
        "chatqna.backends.protocols",
        "chatqna.upstream.proxies",
    ),
    "chatqna.ui": (),
    # The composition root: the one place that names concrete implementations.
    "chatqna.composition": (
        "chatqna.backends",
        "chatqna.retrieval",
        "chatqna.multiturn",
        "chatqna.upstream",
    ),
    # One turn: Protocols, the live bundle, multi-turn, the tracer and span names only.
    "chatqna.pipeline": (
        "chatqna.multiturn",
        "chatqna.backends.protocols",
        "chatqna.backends.bundle",
        "chatqna.backends.vectors",
        "chatqna.retrieval.fusion",
        "chatqna.telemetry.names",
        "chatqna.telemetry.tracing",
    ),
    # The observer turns the pipeline's typed record into span attributes and metrics.
    "chatqna.telemetry": (
        "chatqna.pipeline.record",
        "chatqna.multiturn",
        "chatqna.backends.protocols",
    ),
    # What the pipeline, the API and the HTTP stack import from telemetry stays a leaf.
    "chatqna.telemetry.names": (),
    "chatqna.telemetry.tracing": (),
    # Client spans follow the tracer's rule for a dropped trace.
    "chatqna.telemetry.client_spans": ("chatqna.telemetry.tracing",),
    "chatqna.telemetry.metrics": (),
    "chatqna.multiturn": ("chatqna.backends.protocols", "chatqna.backends.vectors"),
    # Model clients: Protocols, implementations, and the HTTP stack under the remote ones.
    "chatqna.backends": ("chatqna.upstream",),
    "chatqna.backends.protocols": (),
    "chatqna.backends.vectors": (),
    # The live set of one service: the clients plus the history translator built over them.
    "chatqna.backends.bundle": ("chatqna.backends.protocols", "chatqna.multiturn.translate"),
    # Test doubles tokenise as the lexical legs do.
    "chatqna.backends.fakes": (
        "chatqna.backends.protocols",
        "chatqna.backends.vectors",
        "chatqna.retrieval.query",
    ),
    "chatqna.upstream": ("chatqna.telemetry.client_spans",),
    # Retrieval: the query and fusion beside the Protocols, the remote client, two stores.
    "chatqna.retrieval": ("chatqna.backends.protocols", "chatqna.upstream"),
    "chatqna.retrieval.query": (),
    "chatqna.retrieval.fusion": (),
    "chatqna.retrieval.embedded": (
        "chatqna.backends.protocols",
        "chatqna.retrieval.query",
        "chatqna.retrieval.fusion",
    ),
    "chatqna.retrieval.redis": (
        "chatqna.backends.protocols",
        "chatqna.retrieval.query",
        "chatqna.retrieval.fusion",
    ),
    # Fetched links are inflated in bounded steps, as upstream answers are.
    "chatqna.ingest": ("chatqna.backends.protocols", "chatqna.upstream.decoding"),
}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, modules: Iterable[str]) -> set[str]:
    """The chatqna modules a module's source imports, at the top or inside a function.

    `from chatqna.telemetry import attributes` imports the module `chatqna.telemetry.
    attributes`, not just the package: a name that is a module counts as that module.
    """
    known = set(modules)
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            named = submodules & known
            found.update(named)
            if named != submodules or not named:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == ROOT or m.startswith(ROOT + ".")}


def imports() -> dict[str, set[str]]:
    """Module -> the chatqna modules it imports."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imported(path.read_text(), paths) for name, path in paths.items()}


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def key_of(module: str, table: Mapping[str, Iterable[str]]) -> str | None:
    """The most specific key of `table` that holds `module` (None when none does)."""
    keys = [key for key in table if within(module, key) and key != ROOT]
    if not keys:
        return ROOT if module == ROOT else None
    return max(keys, key=len)


def forbidden(
    graph: Mapping[str, set[str]], table: Mapping[str, Iterable[str]]
) -> set[tuple[str, str]]:
    """Every (importer, imported) edge the map does not allow."""
    found: set[tuple[str, str]] = set()
    for module, targets in graph.items():
        key = key_of(module, table)
        if key is None:
            found.add((module, "<not on the map>"))
            continue
        allowed = (key, *SHARED, *table[key])
        for target in targets:
            if target == ROOT:
                continue
            if not any(within(target, entry) for entry in allowed):
                found.add((module, target))
    return found


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
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


def test_every_import_in_chatqna_is_on_the_map() -> None:
    assert forbidden(imports(), ALLOWED) == set()


def test_every_key_of_the_map_names_code_that_exists() -> None:
    modules = set(imports())
    for key, entries in ALLOWED.items():
        for name in (key, *entries):
            assert any(within(m, name) for m in modules), name


def test_the_checker_catches_a_forbidden_edge() -> None:
    graph = {
        "chatqna.backends.tei": {"chatqna.upstream.client", "chatqna.pipeline.orchestrator"},
        "chatqna.pipeline.orchestrator": {"chatqna.telemetry.names", "chatqna.composition"},
        "chatqna.retrieval.redis.store": {"chatqna.retrieval.embedded.index"},
        "chatqna.retrieval.embedded.index": {"chatqna.retrieval.embedded.lock", "chatqna.errors"},
        "chatqna.newpackage.thing": {"chatqna.errors"},
    }
    assert forbidden(graph, ALLOWED) == {
        ("chatqna.backends.tei", "chatqna.pipeline.orchestrator"),
        ("chatqna.pipeline.orchestrator", "chatqna.composition"),
        ("chatqna.retrieval.redis.store", "chatqna.retrieval.embedded.index"),
        ("chatqna.newpackage.thing", "<not on the map>"),
    }


def test_a_module_key_is_narrower_than_its_package() -> None:
    # The pipeline may import the tracer, never the attribute builders.
    graph = {"chatqna.pipeline.orchestrator": {"chatqna.telemetry.attributes"}}
    assert forbidden(graph, ALLOWED) == {
        ("chatqna.pipeline.orchestrator", "chatqna.telemetry.attributes")
    }
    assert forbidden({"chatqna.telemetry.tracing": {"chatqna.pipeline.record"}}, ALLOWED)


def test_from_a_package_import_a_module_counts_as_that_module() -> None:
    source = "from chatqna.telemetry import attributes, names\nfrom chatqna import errors\n"
    modules = ["chatqna.telemetry.attributes", "chatqna.telemetry.names", "chatqna.errors"]
    assert imported(source, modules) == set(modules)
    assert imported("from chatqna import __version__\n", modules) == {"chatqna"}


def test_no_module_imports_itself_round_a_cycle() -> None:
    assert cycles(imports()) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_architecture_page_draws_this_map() -> None:
    """Each key of the map has its row in the docs' "Who may import whom" table."""
    text = DOCS.read_text()
    section = text[text.index("### Who may import whom") + 1 :]
    section = section.split("\n## ", 1)[0].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented: dict[str, set[str]] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        names = {name.strip("`") for name in cells[0].split(", ")}
        targets = {t.strip("`") for t in cells[1].split(", ") if t.startswith("`")}
        for name in names:
            documented["chatqna" if name == "chatqna" else f"chatqna.{name}"] = {
                f"chatqna.{t}" for t in targets
            }
    expected = {key: set(entries) - set(SHARED) for key, entries in ALLOWED.items()}
    assert documented == expected
