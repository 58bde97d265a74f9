"""A throwaway git checkout, for the provenance of a benchmark run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


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
