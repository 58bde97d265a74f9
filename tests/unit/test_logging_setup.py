"""Logging set-up: the log level and the one format."""

from __future__ import annotations

import logging

from chatqna.logging_setup import configure_logging
from chatqna.settings import Settings


def test_logging_is_configured_at_the_log_level_in_one_format() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()  # pytest's own handlers would make basicConfig a no-op
    try:
        configure_logging(Settings(chatqna_log_level="DEBUG"))
        (handler,) = root.handlers
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    record = logging.LogRecord("chatqna.app", logging.WARNING, __file__, 1, "hello", None, None)
    assert handler.formatter is not None
    assert handler.formatter.format(record).endswith(" WARNING chatqna.app: hello")
