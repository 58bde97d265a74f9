"""Tests mirror the package: each module of `chatqna/` has `tests/unit/<package>/test_<module>.py`,
or else a row in the architecture page's "Modules tested elsewhere" table naming tests that
exist; the studies in `benchmarks/experiments/` are mirrored under `tests/benchmarks/`."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "chatqna"
DOCS = REPO / "site" / "docs" / "architecture.md"


def mirrored_test(module: Path) -> Path:
    relative = module.relative_to(PACKAGE)
    return REPO / "tests" / "unit" / relative.parent / f"test_{relative.name}"


def modules() -> list[Path]:
    return sorted(
        path for path in PACKAGE.rglob("*.py") if path.name not in {"__init__.py", "__main__.py"}
    )


def elsewhere_table() -> dict[str, list[str]]:
    """The "Modules tested elsewhere" table: module path -> the test files it names."""
    text = DOCS.read_text()
    section = text[text.index("### Modules tested elsewhere") :]
    section = section.split("\n## ", 1)[0].split("\n### ", 1)[0]
    table: dict[str, list[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| `chatqna/"):
            continue
        module, tests = (cell.strip() for cell in line.strip("|").split("|")[:2])
        table[module.strip("`")] = [t.strip().strip("`") for t in tests.split(",")]
    return table


def test_every_module_has_its_unit_test_or_says_where_it_is_tested() -> None:
    elsewhere = elsewhere_table()
    missing = [
        path.relative_to(REPO).as_posix()
        for path in modules()
        if not mirrored_test(path).is_file() and path.relative_to(REPO).as_posix() not in elsewhere
    ]
    assert missing == []


def test_the_tests_named_elsewhere_exist_for_modules_that_exist() -> None:
    """A row names a module that exists, has no unit test of its own (a module that gained
    one loses its row), and tests that exist."""
    for module, tests in elsewhere_table().items():
        assert (REPO / module).is_file(), module
        assert not mirrored_test(REPO / module).is_file(), f"{module} has its own unit test"
        assert tests, module
        for test in tests:
            assert (REPO / test).is_file(), f"{module}: {test}"


def test_every_unit_test_file_mirrors_a_module() -> None:
    """A `tests/unit/.../test_<name>.py` tests `chatqna/.../<name>.py` (or a part of it,
    `test_<name>_<part>.py`), so a moved module takes its tests along."""
    unit = REPO / "tests" / "unit"
    stray = []
    for test in sorted(unit.rglob("test_*.py")):
        relative = test.relative_to(unit)
        stem = relative.name.removeprefix("test_").removesuffix(".py")
        folder = PACKAGE / relative.parent
        names = {p.stem for p in folder.glob("*.py")} if folder.is_dir() else set()
        if not any(stem == name or stem.startswith(name + "_") for name in names):
            stray.append(relative.as_posix())
    assert stray == []


# The studies beside the benchmark scripts are a package too, with tests that mirror it.
STUDIES = REPO / "benchmarks" / "experiments"
STUDY_TESTS = REPO / "tests" / "benchmarks" / "experiments"


def test_the_benchmarks_studies_have_mirrored_tests() -> None:
    """Each module of `benchmarks/experiments/` has `tests/benchmarks/experiments/
    test_<module>.py`, and each test file there names a module of it."""
    studies = {p.stem for p in STUDIES.glob("*.py") if p.name != "__init__.py"}
    tests = {p.stem.removeprefix("test_") for p in STUDY_TESTS.glob("test_*.py")}
    assert studies and studies == tests
