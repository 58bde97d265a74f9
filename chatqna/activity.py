"""Requests in flight and finished: kept by the request middleware, read by the metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestActivity:
    """Requests in flight and finished, kept by the request middleware."""

    in_flight: int = 0
    finished: int = 0

    def started(self) -> None:
        self.in_flight += 1

    def ended(self) -> None:
        self.in_flight -= 1
        self.finished += 1
