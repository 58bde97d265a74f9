"""Workers: the cores `CHATQNA_WORKERS=auto` counts, the variables that carry overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chatqna.workers import usable_cores, worker_environment


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", "all"),  # no CPU limit
        ("100000 100000\n", 1),  # a limit of 1 CPU
        ("150000 100000\n", 1),  # 1.5 CPUs: rounded down
        ("50000 100000\n", 1),  # below one CPU: still one worker
        ("6400000 100000\n", "all"),  # more CPUs than this process may run on
        ("garbage\n", "all"),
        (None, "all"),  # no cgroup v2 file (cgroup v1, or not Linux containers)
    ],
)
def test_auto_workers_count_the_cgroup_cpu_limit(
    tmp_path: Path, cpu_max: str | None, expected: int | str
) -> None:
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(path) == (affinity if expected == "all" else expected)


def test_worker_environment_names_each_override_by_its_variable(tmp_path: Path) -> None:
    overrides = {"mega_service_port": 9000, "chatqna_data_dir": tmp_path, "chatqna_host": None}
    assert worker_environment(overrides) == {
        "MEGA_SERVICE_PORT": "9000",
        "CHATQNA_DATA_DIR": str(tmp_path),
    }
    with pytest.raises(KeyError, match="not settings: mega_port"):
        worker_environment({"mega_port": 9000})
