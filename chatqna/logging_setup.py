"""Logging set-up: one format for the server and every command, at `CHATQNA_LOG_LEVEL`."""

from __future__ import annotations

import logging

from chatqna.settings import Settings

# One line per record, as the server and every command write it.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(settings: Settings) -> None:
    """Log at `CHATQNA_LOG_LEVEL` in `LOG_FORMAT` (a no-op where logging is configured)."""
    logging.basicConfig(level=settings.chatqna_log_level, format=LOG_FORMAT)
