"""A throwaway git checkout, for the provenance of a benchmark run; the benchmark run on the
tiny dataset; blends of the seed's values."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.evaluation.dataset import load_dataset
from chatqna.evaluation.runner import run_benchmark
from chatqna.evaluation.strategies import SEED, QueryStrategy
from tests.unit.evaluation.test_dataset import write_dataset

TinyRun = Callable[..., Awaitable[dict[str, Any]]]


def blend(**values: Any) -> QueryStrategy:
    """The seed blend with these multi-turn `values` (`MultiTurnConfig` fields)."""
    return QueryStrategy("blend", replace(SEED, **values))


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
def checkout(tmp_path: Path) -> Path:
    """A repository with one commit: code, a result file, and `.cache/` ignored."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "bench.py").write_text("print('measure')\n")
    (repo / "benchmarks" / "results" / "bench.json").write_text("{}\n")
    (repo / ".gitignore").write_text("/.cache/\n")
    git(repo, "init", "--quiet")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "one")
    return repo


@pytest.fixture
def run_tiny(tmp_path: Path) -> TinyRun:
    """`run_benchmark(strategies, **options)` on the tiny dataset (`write_dataset`), with the
    hashing embedder and no LLM; returns the results document."""
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    embedder = HashingEmbedder()

    async def run(strategies: Sequence[QueryStrategy], **options: Any) -> dict[str, Any]:
        return await run_benchmark(dataset, strategies, embedder, embedder, None, **options)

    return run
