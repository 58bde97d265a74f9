"""The server's worker processes: how many cores `CHATQNA_WORKERS=auto` counts, and the
variables that carry the command's options to the workers, which read their settings from
the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from chatqna.settings import Settings

# The cgroup v2 CPU limit of this process's container: `max`, or `<quota> <period>` in µs.
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores(cpu_max: Path | None = None) -> int:
    """The cores `CHATQNA_WORKERS=auto` counts: those this process may run on, capped by a
    cgroup v2 CPU quota (a container's CPU limit; `cpu_max` is its file) rounded down, at
    least 1."""
    if cpu_max is None:
        cpu_max = CGROUP_CPU_MAX
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()
        limit = cores if quota == "max" else int(quota) // int(period)
    except (OSError, ValueError):  # no cgroup v2 file here, or not one we can read
        return cores
    return max(1, min(cores, limit))


def worker_environment(overrides: Mapping[str, object]) -> dict[str, str]:
    """The variables that carry `overrides` (setting name -> value; None: not overridden) to
    worker processes, which read their settings from the environment."""
    unknown = set(overrides) - set(Settings.model_fields)
    if unknown:
        raise KeyError(f"not settings: {', '.join(sorted(unknown))}")
    return {name.upper(): str(value) for name, value in overrides.items() if value is not None}
