"""The statistics of `tests/rag-benchmarks/tracing_overhead.py`: its two measures, and the
95% interval of each from a bootstrap over replicas."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "tests" / "rag-benchmarks"
RESULTS = BENCHMARKS / "results"
MEASURES = ("ratio_on_off", "paired_ratio_on_off", "ratio_sampled_off", "paired_ratio_sampled_off")


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    # The folder name has a hyphen, and the script imports its siblings by their names.
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "tracing_overhead", BENCHMARKS / "tracing_overhead.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def rounds_of(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {setting: figures["rounds"] for setting, figures in report["summary"].items()}


def run(rps: dict[str, list[float]]) -> dict[str, list[dict[str, Any]]]:
    return {setting: [{"rps": value} for value in values] for setting, values in rps.items()}


@pytest.mark.parametrize(
    "name",
    [
        "tracing_overhead.json",
        "tracing_overhead_16_replicas_second.json",
        "tracing_overhead_same_layout_96_rounds.json",
        "tracing_overhead_together_second.json",
    ],
)
def test_measures_match_what_the_committed_runs_printed(harness: ModuleType, name: str) -> None:
    report = json.loads((RESULTS / name).read_text())
    measures = harness.throughput_ratios(
        rounds_of(report), range(len(report["summary"]["off"]["rounds"]))
    )
    for measure in MEASURES:
        assert measures[measure] == pytest.approx(report[measure])


def test_interval_holds_the_runs_own_measures_and_is_repeatable(harness: ModuleType) -> None:
    report = json.loads((RESULTS / "tracing_overhead_16_replicas.json").read_text())
    results = rounds_of(report)
    interval = harness.replica_bootstrap(results, report["replicas"])
    assert interval == harness.replica_bootstrap(results, report["replicas"])  # seeded
    assert interval == report["interval_95_over_replicas"]
    for measure in MEASURES:
        low, high = interval[measure]
        assert low <= report[measure] <= high


def test_no_spread_gives_a_point(harness: ModuleType) -> None:
    results = run({"off": [100.0] * 12, "on": [90.0] * 12, "sampled": [100.0] * 12})
    interval = harness.replica_bootstrap(results, 4, draws=200)
    assert interval["ratio_on_off"] == pytest.approx([0.9, 0.9])
    assert interval["paired_ratio_sampled_off"] == pytest.approx([1.0, 1.0])


def test_replicas_are_drawn_whole(harness: ModuleType) -> None:
    # Replica 0 of the traced setting is slow in every one of its rounds. Drawn whole, it
    # is in some draws three times and in others not at all, so the interval of the paired
    # measure reaches both the slow and the usual ratio; drawn round by round, the median
    # would hardly move.
    replicas, per_replica = 4, 6
    on = [60.0 if n % replicas == 0 else 95.0 for n in range(replicas * per_replica)]
    results = run({"off": [100.0] * len(on), "on": on, "sampled": [100.0] * len(on)})
    low, high = harness.replica_bootstrap(results, replicas, draws=500)["paired_ratio_on_off"]
    assert low == pytest.approx(0.6)
    assert high == pytest.approx(0.95)


def environment_bytes(env: dict[str, str]) -> int:
    return sum(len(key.encode()) + len(value.encode()) + 2 for key, value in env.items())


def test_padded_environments_are_one_size_and_keep_every_setting(harness: ModuleType) -> None:
    envs = [
        {"PYTHONHASHSEED": "0", "OTEL_TRACES_EXPORTER": "none"},
        {"PYTHONHASHSEED": "0", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"},
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "0.1", "A": "é", "B": "2"},
    ]
    padded = harness.same_layout(envs, 48)
    assert len({len(env) for env in padded}) == 1
    assert len({environment_bytes(env) for env in padded}) == 1
    assert (
        environment_bytes(padded[0])
        == max(map(environment_bytes, padded))
        >= max(map(environment_bytes, envs)) + 48
    )
    for original, env in zip(envs, padded, strict=True):
        assert {k: v for k, v in env.items() if not k.startswith("LAYOUT_PAD")} == original
    assert envs[0] == {"PYTHONHASHSEED": "0", "OTEL_TRACES_EXPORTER": "none"}  # not changed


def test_the_offset_moves_every_setting_alike(harness: ModuleType) -> None:
    envs = [{"A": "1"}, {"A": "1", "B": "22"}]
    near, far = harness.same_layout(envs, 0), harness.same_layout(envs, 160)
    assert environment_bytes(far[0]) - environment_bytes(near[0]) == 160
    assert environment_bytes(far[1]) - environment_bytes(near[1]) == 160


def test_the_run_with_padded_environments_kept_one_stack_per_replica() -> None:
    report = json.loads((RESULTS / "tracing_overhead_same_layout_96_rounds.json").read_text())
    stacks = report["start_of_stack"]
    assert report["stack_layout_same_within_replica"] is True
    for replica in range(report["replicas"]):
        assert len({stacks[setting][replica] for setting in ("off", "on", "sampled")}) == 1
    assert len(set(stacks["off"])) > 1  # the replicas do not all share one layout


def test_together_rounds_file_each_result_under_its_own_setting(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The clients of a --together round start in an order that turns with the round; each
    # result must still land under the setting whose server it measured, on the round's
    # replica.
    def together_round(urls: list[str], servers: list[Any], helpers: Any, args: Any) -> list:
        assert servers == [f"process {url}" for url in urls]
        return [{"rps": 1.0, "url": url} for url in urls]

    monkeypatch.setattr(harness, "together_round", together_round)
    replicas, rounds = 2, 5
    urls = {s: [f"{s}-{r}" for r in range(replicas)] for s in harness.SETTINGS}
    servers = {s: [f"process {u}" for u in urls[s]] for s in harness.SETTINGS}
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in harness.SETTINGS}
    args = argparse.Namespace(rounds=rounds, replicas=replicas, together=True)
    harness.run_rounds(results, urls, servers, [], args)
    for setting in harness.SETTINGS:
        assert [r["url"] for r in results[setting]] == [
            f"{setting}-{n % replicas}" for n in range(rounds)
        ]


def test_servers_start_in_sessions_of_their_own(harness: ModuleType, tmp_path: Path) -> None:
    # A session of its own is an autogroup of its own: servers sharing a core in a
    # --together round get equal shares of it per process.
    process = harness.start(
        ["-c", "import time; time.sleep(30)"],
        dict(os.environ),
        tmp_path / "log",
        ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))),
    )
    try:
        assert os.getsid(process.pid) == process.pid != os.getsid(0)
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.mark.parametrize(
    "name", ["tracing_overhead_together.json", "tracing_overhead_together_second.json"]
)
def test_the_together_runs_split_the_server_core_evenly(name: str) -> None:
    # Equal shares are what make the ratio of requests/s the inverse ratio of CPU per
    # request; a server core left idle would let a costlier server keep up.
    report = json.loads((RESULTS / name).read_text())
    assert report["together"] is True and report["aa"] is False
    shares = [report["summary"][s]["server_cpu_share_median"] for s in ("off", "on", "sampled")]
    assert max(shares) / min(shares) < 1.02
    for setting in ("off", "on", "sampled"):
        assert report["summary"][setting]["errors"] == 0
    assert max(r["server_core_idle"] for r in report["summary"]["off"]["rounds"]) < 0.05


def test_core_times_count_a_busy_core(harness: ModuleType) -> None:
    # The ticks of the named cores only, never going back, and a core kept busy is not idle
    # for the whole of that time.
    allowed = os.sched_getaffinity(0)
    cpu = str(min(allowed))
    os.sched_setaffinity(0, {int(cpu)})  # the busy loop on the core measured
    try:
        before = harness.core_times(cpu)
        deadline = time.process_time() + 0.3
        while time.process_time() < deadline:
            pass
        after = harness.core_times(cpu)
    finally:
        os.sched_setaffinity(0, allowed)
    total, idle, steal = (a - b for a, b in zip(after, before, strict=True))
    assert total > 0
    assert 0 <= idle < total and 0 <= steal <= total
    assert harness.core_times(f"{cpu},{cpu}")[0] == pytest.approx(
        harness.core_times(cpu)[0], rel=0.01
    )  # a core named twice is counted once
