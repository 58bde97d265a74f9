"""Prometheus metrics at `/metrics`: requests, stage latencies, condense and blend outcomes,
upstream errors. Each app has its own registry, so several apps in one process (tests) do
not collide. `RequestActivity` is the count of requests in flight and finished that the
request middleware keeps.

Served with several workers (`chatqna serve --workers N`), the command points
prometheus_client's multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`) at a fresh directory
before the workers start: each worker writes its values there and a scrape of any worker
sums them all (`scrape_registry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.util.http import sanitize_method
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, values

# Label sets of `chatqna_requests` whose child is kept at hand (routes are templates, so a
# handful, methods the standard ones; the cap only guards against a flood of odd statuses).
MAX_CACHED_LABEL_SETS = 256
STAGE_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


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


def multiprocess_mode() -> bool:
    """True when prometheus_client keeps its values in files shared by several workers."""
    return values.ValueClass is not values.MutexValue


class ServiceMetrics:
    """The counters and histograms of one running service."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "chatqna_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "chatqna_stage_seconds",
            "Time spent per pipeline stage",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.condense = Counter(
            "chatqna_condense",
            "Condense outcomes by status and failure reason",
            ["status", "reason"],
            registry=self.registry,
        )
        self.blend = Counter(
            "chatqna_blend",
            "Blend decisions: executed or skipped, and why",
            ["executed", "reason"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "chatqna_upstream_errors",
            "Upstream failures by backend and error code",
            ["backend", "error"],
            registry=self.registry,
        )

        self._stage_children: dict[str, Any] = {}
        self._request_children: dict[tuple[str, str, int], Any] = {}

        self.activity = RequestActivity()
        self.in_flight = Gauge(
            "chatqna_requests_in_flight",
            "HTTP requests being answered",
            registry=self.registry,
            multiprocess_mode="livesum",
        )

    def scrape_registry(self) -> CollectorRegistry:
        """What `/metrics` reports: this process's registry, or every worker's files."""
        if not multiprocess_mode():
            return self.registry
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        return merged

    def record_stages(self, stages: Mapping[str, float]) -> None:
        children = self._stage_children
        for stage, milliseconds in stages.items():
            child = children.get(stage)
            if child is None:  # stage names are the pipeline's own: a small, fixed set
                child = children[stage] = self.stage_seconds.labels(stage=stage)
            child.observe(milliseconds / 1000.0)

    def count_request(self, route: str, method: str, status: int) -> None:
        """One answered request; the labelled child is looked up once per label set.

        A method outside HTTP's standard ones is counted as `_OTHER`, as OpenTelemetry's
        HTTP conventions have it (`sanitize_method`, which keeps every method when
        `OTEL_PYTHON_INSTRUMENTATION_HTTP_CAPTURE_ALL_METHODS` is set): a server that
        accepts any token as a method (uvicorn on h11) would otherwise make a series of
        each one a client invents. Methods are case-sensitive: `get` is not `GET`, so a
        method counts under its name only as `sanitize_method` spells it (upper case)."""
        method = method if sanitize_method(method) == method else "_OTHER"
        key = (route, method, status)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(route=route, method=method, status=str(status))
            if len(self._request_children) < MAX_CACHED_LABEL_SETS:
                self._request_children[key] = child
        child.inc()
