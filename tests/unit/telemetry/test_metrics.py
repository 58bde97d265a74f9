"""Request counting: in flight goes up and down, finished only up; methods outside HTTP's
standard set share one `_OTHER` series."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from chatqna.telemetry.metrics import RequestActivity, ServiceMetrics


def series(metrics: ServiceMetrics) -> list[str]:
    """The `chatqna_requests_total` lines of a scrape."""
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line.startswith("chatqna_requests_total{")]


def test_invented_methods_are_counted_as_other() -> None:
    metrics = ServiceMetrics()
    for number in range(50):
        metrics.count_request("/v1/chatqna", f"X-INVENTED-{number}", 405)
    assert series(metrics) == [
        'chatqna_requests_total{method="_OTHER",route="/v1/chatqna",status="405"} 50.0'
    ]


@pytest.mark.parametrize("method", ["GET", "POST", "OPTIONS", "PATCH", "QUERY"])
def test_standard_methods_keep_their_name(method: str) -> None:
    metrics = ServiceMetrics()
    metrics.count_request("/v1/chatqna", method, 200)
    assert series(metrics) == [
        f'chatqna_requests_total{{method="{method}",route="/v1/chatqna",status="200"}} 1.0'
    ]


@pytest.mark.parametrize(
    ("method", "label"), [("get", "_OTHER"), ("Post", "_OTHER"), ("GET", "GET"), ("BREW", "_OTHER")]
)
def test_a_method_keeps_its_name_only_as_http_spells_it(method: str, label: str) -> None:
    # HTTP methods are case-sensitive: `get` is another method than `GET`.
    metrics = ServiceMetrics()
    metrics.count_request("/v1/chatqna", method, 405)
    assert series(metrics) == [
        f'chatqna_requests_total{{method="{label}",route="/v1/chatqna",status="405"}} 1.0'
    ]


def test_every_method_is_kept_when_opentelemetry_is_told_to_capture_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_INSTRUMENTATION_HTTP_CAPTURE_ALL_METHODS", "true")
    metrics = ServiceMetrics()
    metrics.count_request("/v1/chatqna", "PROPFIND", 405)
    assert series(metrics) == [
        'chatqna_requests_total{method="PROPFIND",route="/v1/chatqna",status="405"} 1.0'
    ]


def test_in_flight_and_finished() -> None:
    activity = RequestActivity()
    activity.started()
    activity.started()
    activity.ended()
    assert (activity.in_flight, activity.finished) == (1, 1)
