"""`GET /metrics` (Prometheus text format), and the middleware that counts requests and
returns each request's trace id in an `X-Trace-Id` header.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna.api.deps import require_api_key
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.tracing import current_trace_id

router = APIRouter(tags=["observability"], dependencies=[Depends(require_api_key)])
TRACE_HEADER = b"x-trace-id"


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.scrape_registry()
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class RequestMetricsMiddleware:
    """Counts requests by route template and status (and those in flight), and adds
    `X-Trace-Id` when tracing."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}
        trace_id = current_trace_id()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if trace_id is not None:
                    headers = list(message.get("headers", []))
                    headers.append((TRACE_HEADER, trace_id.encode()))
                    message = {**message, "headers": headers}
            await send(message)

        self.metrics.activity.started()
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.activity.ended()
            self.metrics.in_flight.dec()
            self.metrics.count_request(_route_of(scope), scope["method"], status["code"])


def _route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "unmatched"
