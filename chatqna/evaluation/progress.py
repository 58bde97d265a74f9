"""Progress of `chatqna bench` on stderr, wherever it runs, and its per-turn logs at DEBUG.

A benchmark over a development dataset runs for many minutes. On a terminal each task
(embedding the corpus, planning a mode, replaying a conversation set) draws a tqdm bar; with
stderr going to a file, a pipe or a CI log, where a bar would print nothing useful, each task
writes one line when it starts, one every `every_seconds` while it runs and one when it
ends. The pipeline code the benchmark calls logs some decisions per turn at INFO or WARNING
(a blend that did not run for lack of history, a failed rewrite); over thousands of turns
those lines drown the progress, and the benchmark reports them in its results anyway, so
`turn_logs_at_debug` lowers them to DEBUG while it runs (`CHATQNA_LOG_LEVEL=DEBUG` shows
them).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

Tick = Callable[[int], None]
Progress = Callable[[str, int], Tick]

# The packages whose loggers speak once per turn: what plans and runs a turn.
TURN_LOGGERS = ("chatqna.multiturn", "chatqna.pipeline")


def line_progress(
    stream: TextIO, every_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic
) -> Progress:
    """Progress as plain lines: `task: done/total (percent), elapsed` at the start, at most
    every `every_seconds`, and at the end."""

    def start(description: str, total: int) -> Tick:
        began = clock()
        state = {"done": 0, "printed": began}

        def report() -> None:
            share = state["done"] / total if total else 1.0
            elapsed = clock() - began
            print(
                f"{description}: {state['done']}/{total} ({share:.0%}), {elapsed:.0f} s",
                file=stream,
                flush=True,
            )
            state["printed"] = clock()

        def tick(count: int) -> None:
            state["done"] += count
            if state["done"] >= total or clock() - state["printed"] >= every_seconds:
                report()

        report()
        return tick

    return start


def tqdm_progress(stream: TextIO) -> Progress:
    """Progress as tqdm bars, for a terminal."""
    from tqdm import tqdm

    def start(description: str, total: int) -> Tick:
        bar = tqdm(total=total, desc=description, file=stream, leave=False)

        def tick(count: int) -> None:
            bar.update(count)
            if bar.n >= total:
                bar.close()

        return tick

    return start


def stderr_progress(stream: TextIO | None = None, every_seconds: float = 30.0) -> Progress:
    """Bars on a terminal, lines anywhere else: progress always shows."""
    target = sys.stderr if stream is None else stream
    if target.isatty():
        return tqdm_progress(target)
    return line_progress(target, every_seconds)


class _AtDebug(logging.Filter):
    """Lowers a record below ERROR to DEBUG, and drops it unless DEBUG is wanted."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


@contextmanager
def turn_logs_at_debug(prefixes: Sequence[str] = TURN_LOGGERS) -> Iterator[None]:
    """While the benchmark runs, what the per-turn loggers say below ERROR is DEBUG: the
    loggers under `prefixes` that exist when it starts (modules make theirs on import)."""
    names = [
        name
        for name in logging.Logger.manager.loggerDict
        if any(name == p or name.startswith(p + ".") for p in prefixes)
    ]
    loggers = [logging.getLogger(name) for name in {*names, *prefixes}]
    only = _AtDebug()
    for logger in loggers:
        logger.addFilter(only)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(only)
