"""Writes a benchmark's one current result file, stamped with where it was measured.

Every script in `benchmarks/` writes through `write_result`, so each file under
`benchmarks/results/` says which commit was measured (`measured_at_commit`, from
`git rev-parse HEAD`), the command that ran, the machine (cores, load averages, Python,
platform) and the date. Earlier results live in git's history of the file, not beside it
under other names.

Each script calls `start_run()` first thing in its `main`, once its arguments are read: the
commit is taken then, and a run is refused from a work tree with uncommitted changes
(outside `benchmarks/results/`; ignored files do not count), before it measures anything:
its figures would belong to code no commit holds. Set `CHATQNA_BENCH_ALLOW_DIRTY=1` to
run anyway, stamped `<commit>+dirty`. A work tree that changes during the run does not
cost the result: `write_result` stamps it with the commit the run started from, whose
code the run loaded, and warns on stderr of what changed. The command
recorded is the one to run again: the service settings it ran with (the `Settings`
variables set in the environment, secrets left out) go before it, as in
`MULTI_TURN_BLEND_ENABLED=true python benchmarks/turn_latency.py --repeat 20`.

A benchmark whose figures come from several runs (index scale at 100k and at 1M chunks,
say) keeps them in one file: `write_result(..., configuration="1m")` replaces that named
run under `configurations` and leaves the others as they are.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chatqna.evaluation.provenance import (
    changed_during_run,
    machine,
    measured_commit,
    recorded_command,
    utc_now,
)
from chatqna.settings import dirty_results_allowed

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


# The commit this process's run measures (None outside a git checkout), under "commit"
# once its script called `start_run()`.
_started: dict[str, str | None] = {}


def start_run(*, allow_dirty: bool | None = None) -> str | None:
    """Take the commit this run measures, before it measures anything: from a work tree
    with uncommitted changes, DirtyWorkTree unless `allow_dirty` (by default, whether
    `CHATQNA_BENCH_ALLOW_DIRTY=1` is set), and the commit is then `<id>+dirty`."""
    _started["commit"] = _measured_now(allow_dirty)
    return _started["commit"]


def _measured_now(allow_dirty: bool | None) -> str | None:
    allowed = dirty_results_allowed() if allow_dirty is None else allow_dirty
    return measured_commit(REPO, allow_dirty=allowed)


def command_line(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The command as it was typed from the repository root, after the service settings
    it ran with."""
    words = list(sys.argv if argv is None else argv)
    script = Path(words[0]).resolve() if words else None
    if script is not None and script.is_file() and script.is_relative_to(REPO):
        words[0] = str(script.relative_to(REPO))
    return recorded_command("python " + shlex.join(words), environ)


def stamp(
    results: dict[str, Any],
    argv: Sequence[str] | None = None,
    *,
    allow_dirty: bool | None = None,
) -> dict[str, Any]:
    """`results` with its provenance first: commit, command, machine and date. The commit
    is the one `start_run()` took (warned of when the work tree changed since); a script that
    did not call it has the work tree checked now, as `start_run()` would."""
    if "commit" not in _started:
        commit = _measured_now(allow_dirty)
    else:
        commit = _started["commit"]
        warning = changed_during_run(REPO, commit)
        if warning is not None:
            print(warning, file=sys.stderr)
    provenance = {
        "measured_at_commit": commit,
        "command": command_line(argv),
        # What the script measured of the machine itself (load before and after) is kept.
        "machine": {**machine(), **results.get("machine", {})},
        "date": utc_now(),
    }
    return {**provenance, **{k: v for k, v in results.items() if k not in provenance}}


def write_result(
    path: Path,
    results: dict[str, Any],
    *,
    configuration: str | None = None,
    argv: Sequence[str] | None = None,
    allow_dirty: bool | None = None,
) -> Path:
    """Stamp `results` and write them to `path` (JSON); with `configuration`, as that named
    run of the file's `configurations`, keeping the file's other runs. The commit is the
    one `start_run()` took; without it, as `start_run(allow_dirty=allow_dirty)` takes it now."""
    stamped = stamp(results, argv, allow_dirty=allow_dirty)
    document: dict[str, Any] = stamped
    if configuration is not None:
        document = json.loads(path.read_text()) if path.exists() else {}
        document.setdefault("benchmark", path.stem)
        document.setdefault("configurations", {})[configuration] = stamped
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
