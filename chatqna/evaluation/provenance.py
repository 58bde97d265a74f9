"""Where a benchmark result was measured, shared by `chatqna bench` and `benchmarks/*.py`.

A result names the commit it measured, so a run is refused from a work tree that differs
from that commit (a tracked file changed, staged or not, or a new file git does not ignore):
the figures would belong to code no commit holds. The operator may opt in (the result is
then stamped `<commit>+dirty`). Ignored files (`.cache/`, `.venv/`) do not count, nor does
anything under `benchmarks/results/`: those are earlier results, not code, and a session
re-running several benchmarks writes them one after another.

The commit is taken, and the work tree checked, when a run starts: the code measured is
the code the run loaded then. A work tree that changes during a long run (an edit, a
commit, a checkout) does not cost its result: it is written stamped with the commit the
run started from, with a warning that says what changed.

A recorded command reproduces the run only with the settings it ran with, so it is prefixed
with the `Settings` variables that were set, secrets left out and credentials taken out of
URLs (a URL that cannot be parsed is hidden whole).
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import SecretStr

from chatqna.settings import Settings, variables_set

OPT_IN = "set CHATQNA_BENCH_ALLOW_DIRTY=1"
# The whole work tree but earlier results. The positive `:(top)` matters: with only an
# exclude, `git ls-files` looks at the current directory alone.
TREE_PATHSPEC = (":(top)", ":(top,exclude)benchmarks/results")
# A variable named like a secret is left out even when its field is not a `SecretStr`.
_SECRET_NAME = re.compile(r"KEY|PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL", re.IGNORECASE)
# A query parameter named so holds a secret too (`?sig=`, `?auth=`, `?X-Amz-Signature=`).
_SECRET_QUERY = re.compile(_SECRET_NAME.pattern + r"|PWD|SIG|AUTH", re.IGNORECASE)
# What a record shows of a URL-like value it cannot parse, so cannot clean.
HIDDEN = "<hidden: not a URL the record could clean>"
_SHOWN_CHANGES = 5


class DirtyWorkTree(RuntimeError):
    """The work tree has uncommitted changes to tracked files, and no opt-in was given."""

    def __init__(self, commit: str, changes: list[str], opt_in: str) -> None:
        super().__init__(
            f"refusing to record a result measured at {commit[:12]} from a work tree with "
            f"uncommitted changes ({_listed(changes)}): commit them and re-run, or {opt_in} "
            f"to record it as measured at {commit[:12]}+dirty"
        )
        self.changes = changes


def _listed(changes: list[str]) -> str:
    shown = ", ".join(changes[:_SHOWN_CHANGES])
    more = len(changes) - _SHOWN_CHANGES
    return f"{shown} and {more} more" if more > 0 else shown


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def uncommitted_changes(repo: Path) -> list[str]:
    """The files outside `benchmarks/results/` that differ from HEAD: tracked files changed
    (staged or not), and new files git does not ignore; the whole work tree, by paths from
    its top, wherever in it `repo` is."""
    changed = _git(repo, "diff", "--name-only", "HEAD", "--", *TREE_PATHSPEC) or ""
    untracked = ("ls-files", "--others", "--exclude-standard", "--full-name")
    new = _git(repo, *untracked, "--", *TREE_PATHSPEC) or ""
    return [line for line in [*changed.splitlines(), *new.splitlines()] if line]


def measured_commit(repo: Path, *, allow_dirty: bool, opt_in: str = OPT_IN) -> str | None:
    """HEAD's id (None outside a git checkout); when the work tree has uncommitted changes,
    `<id>+dirty` if `allow_dirty`, else DirtyWorkTree, whose message says to `opt_in`."""
    commit = _git(repo, "rev-parse", "HEAD")
    if commit is None:
        return None
    changes = uncommitted_changes(repo)
    if not changes:
        return commit
    if not allow_dirty:
        raise DirtyWorkTree(commit, changes, opt_in)
    return f"{commit}+dirty"


def changed_during_run(repo: Path, measured: str | None) -> str | None:
    """A warning, at the end of a run stamped `measured`, when the checkout no longer is
    that clean commit (HEAD moved, or files changed); None when it is, or when there is
    nothing to compare (no checkout, or a run already stamped `+dirty`). The result stays
    stamped `measured`: the run loaded its code from that commit."""
    if measured is None or measured.endswith("+dirty"):
        return None
    head = _git(repo, "rev-parse", "HEAD")
    if head is not None and head != measured:
        change = f"HEAD moved from {measured[:12]} to {head[:12]}"
    elif changes := uncommitted_changes(repo):
        change = f"uncommitted changes: {_listed(changes)}"
    else:
        return None
    return (
        f"warning: the work tree changed during the run ({change}); the result is stamped "
        f"{measured[:12]}, the commit the run started from"
    )


def _is_secret(name: str) -> bool:
    if _SECRET_NAME.search(name):
        return True
    field = Settings.model_fields.get(name.lower())
    annotation = None if field is None else field.annotation
    return annotation is SecretStr or SecretStr in getattr(annotation, "__args__", ())


def _without_credentials(value: str) -> str:
    """A URL as a record may show it: without its user information nor query parameters
    named like secrets; `HIDDEN` in place of one that cannot be parsed.

    The user information is everything between `://` and the last `@`, whatever it holds:
    a password with `/` or `#` in it is not cut where a URL parser would end the
    authority. An `@` in a path after the host takes more than the credentials with it,
    which a record can afford; one after a `?` may be inside a query value, whose tail
    would then be shown as the host, so such a value is hidden whole."""
    scheme, separator, rest = value.partition("://")
    if not separator:
        return value
    userinfo, _, host_on = rest.rpartition("@")
    if "?" in userinfo:
        return HIDDEN
    try:
        parts = urlsplit(f"{scheme}://{host_on}")
        pairs = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return HIDDEN
    kept = [(key, item) for key, item in pairs if not _SECRET_QUERY.search(key)]
    if host_on == rest and len(kept) == len(pairs):
        return value
    if len(kept) == len(pairs):
        return f"{scheme}://{host_on}"
    return urlunsplit(parts._replace(query=urlencode(kept)))


def recordable_environment(variables: Mapping[str, str]) -> dict[str, str]:
    """The `Settings` variables a command ran with, as a record may show them: no secret
    (a `SecretStr` field or a name like `*_KEY`), no credentials in a URL; sorted by name."""
    return {
        name: _without_credentials(value)
        for name, value in sorted(variables.items())
        if not _is_secret(name)
    }


def with_environment(command: str, variables: Mapping[str, str]) -> str:
    """`command` as a shell runs it with `variables` set: `NAME=value ... command`."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in variables.items()]
    return " ".join([*assignments, command])


def recorded_command(command: str, environ: Mapping[str, str] | None = None) -> str:
    """`command` as a record shows it: after the `Settings` variables set in `environ` (the
    process environment by default) that a record may show."""
    return with_environment(command, recordable_environment(variables_set(environ)))


def machine() -> dict[str, Any]:
    """The machine as a reader needs it to weigh a figure: cores and how busy they were."""
    one, five, fifteen = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "load_average_1_5_15_min": [round(one, 2), round(five, 2), round(fifteen, 2)],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
