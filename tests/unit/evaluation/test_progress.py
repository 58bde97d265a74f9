"""Progress on stderr wherever the benchmark runs, and its per-turn logs at DEBUG."""

from __future__ import annotations

import io
import logging

import pytest

from chatqna.evaluation.progress import line_progress, stderr_progress, turn_logs_at_debug


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_at_the_start_every_interval_and_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    tick = line_progress(out, every_seconds=30, clock=clock)("embedding corpus", 10)
    tick(3)  # within the interval: nothing
    clock.now += 31
    tick(2)
    clock.now += 5
    tick(5)
    assert out.getvalue().splitlines() == [
        "embedding corpus: 0/10 (0%), 0 s",
        "embedding corpus: 5/10 (50%), 31 s",
        "embedding corpus: 10/10 (100%), 36 s",
    ]


def test_a_stream_that_is_not_a_terminal_gets_lines() -> None:
    out = io.StringIO()  # a file, a pipe, a CI log
    stderr_progress(out)("planning stateless", 2)(2)
    assert out.getvalue().splitlines()[-1] == "planning stateless: 2/2 (100%), 0 s"


def test_an_empty_task_reports_done() -> None:
    out = io.StringIO()
    line_progress(out)("replaying", 0)
    assert out.getvalue() == "replaying: 0/0 (100%), 0 s\n"


def test_turn_logs_are_debug_while_the_benchmark_runs(caplog: pytest.LogCaptureFixture) -> None:
    turn_logger = logging.getLogger("chatqna.multiturn.blend")
    caplog.set_level(logging.INFO)
    with turn_logs_at_debug():
        turn_logger.info("blend not run (no_history)")
        turn_logger.warning("condense failed (reason=timeout)")
        turn_logger.error("index unavailable")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "index unavailable")
    ]
    caplog.clear()
    turn_logger.info("after the run")
    assert [r.levelname for r in caplog.records] == ["INFO"]


def test_with_debug_on_the_turn_logs_show_as_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # Modules make their loggers when imported, before the benchmark starts.
    pipeline, runner = (
        logging.getLogger(f"chatqna.{n}") for n in ("pipeline.orchestrator", "evaluation.runner")
    )
    with turn_logs_at_debug():
        pipeline.info("planned")
        runner.info("not a turn logger")
    assert [(r.name, r.levelname) for r in caplog.records] == [
        ("chatqna.pipeline.orchestrator", "DEBUG"),
        ("chatqna.evaluation.runner", "INFO"),
    ]
