"""The documentation site builds strictly and cannot drift from the settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chatqna.settings import Settings

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "site"


def test_configuration_reference_lists_every_setting() -> None:
    page = (SITE / "docs" / "configuration.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in page]
    assert missing == []


@pytest.mark.slow  # runs mkdocs in a process of its own
def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(SITE / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "multi-turn-retrieval" / "index.html").is_file()


def test_readme_quick_start_is_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip()]
    assert commands == ["./scripts/serve", "./scripts/test"]
    assert "./scripts/test" in (REPO / ".ci" / "run").read_text()
