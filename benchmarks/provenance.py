"""Writes a benchmark's one current result file, stamped with where it was measured.

Every script in `benchmarks/` writes through `write_result`, so each file under
`benchmarks/results/` says which commit was measured (`measured_at_commit`, from
`git rev-parse HEAD`, with `+dirty` when the work tree had uncommitted changes), the
command that ran, the machine (cores, load averages, Python, platform) and the date.
Earlier results live in git's history of the file, not beside it under other names.

A benchmark whose figures come from several runs (index scale at 100k and at 1M chunks,
say) keeps them in one file: `write_result(..., configuration="1m")` replaces that named
run under `configurations` and leaves the others as they are.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def current_commit() -> str | None:
    """HEAD's id, marked `+dirty` when tracked files differ from it."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}+dirty" if dirty else commit


def machine() -> dict[str, Any]:
    """The machine as a reader needs it to weigh a figure: cores and how busy they were."""
    one, five, fifteen = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "load_average_1_5_15_min": [round(one, 2), round(five, 2), round(fifteen, 2)],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as it was typed from the repository root."""
    words = list(sys.argv if argv is None else argv)
    script = Path(words[0]).resolve() if words else None
    if script is not None and script.is_file() and script.is_relative_to(REPO):
        words[0] = str(script.relative_to(REPO))
    return "python " + shlex.join(words)


def stamp(results: dict[str, Any], argv: Sequence[str] | None = None) -> dict[str, Any]:
    """`results` with its provenance first: commit, command, machine and date."""
    provenance = {
        "measured_at_commit": current_commit(),
        "command": command_line(argv),
        # What the script measured of the machine itself (load before and after) is kept.
        "machine": {**machine(), **results.get("machine", {})},
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return {**provenance, **{k: v for k, v in results.items() if k not in provenance}}


def write_result(
    path: Path,
    results: dict[str, Any],
    *,
    configuration: str | None = None,
    argv: Sequence[str] | None = None,
) -> Path:
    """Stamp `results` and write them to `path` (JSON); with `configuration`, as that named
    run of the file's `configurations`, keeping the file's other runs."""
    stamped = stamp(results, argv)
    document: dict[str, Any] = stamped
    if configuration is not None:
        document = json.loads(path.read_text()) if path.exists() else {}
        document.setdefault("benchmark", path.stem)
        document.setdefault("configurations", {})[configuration] = stamped
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
