"""`GET /metrics` (Prometheus text format), and the middleware that counts requests and
returns each request's trace id in an `X-Trace-Id` header.

A request's `route` label is the template of the route that answered it. One that a guard
refused before the router ran (401, 413, 429) has the template of the app's route its path
names, so `route="/v1/chatqna",status="429"` counts refused chats; any other path is
`unmatched`, which keeps the label's values to the app's own routes. A response whose client
left before its last frame (a stream cut short) counts as 499, as one whose client left
before it started does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna.api.deps import require_api_key
from chatqna.api.disconnects import CLIENT_CLOSED_REQUEST, ClientPresence
from chatqna.api.guards import route_path
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.tracing import current_trace_id

router = APIRouter(tags=["observability"], dependencies=[Depends(require_api_key)])
TRACE_HEADER = b"x-trace-id"


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.scrape_registry()
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


UNMATCHED = "unmatched"


class RouteLabel:
    """The `route` label of a request: the template of the route the router chose, else
    that of the first of `routes` whose pattern its path (`route_path`) matches, else
    `UNMATCHED`."""

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self._templates: list[tuple[re.Pattern[str], str]] = [
            (route.path_regex, route.path) for route in routes if isinstance(route, Route)
        ]

    def __call__(self, scope: Scope) -> str:
        routed = getattr(scope.get("route"), "path", None)
        if routed:
            return str(routed)
        path = route_path(scope)
        for pattern, template in self._templates:
            if pattern.match(path):
                return template
        return UNMATCHED


class RequestMetricsMiddleware:
    """Counts requests by route template and status (and those in flight), and adds
    `X-Trace-Id` when tracing."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.route_label = RouteLabel(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}
        answered = False
        trace_id = current_trace_id()

        async def send_wrapper(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if trace_id is not None:
                    headers = list(message.get("headers", []))
                    headers.append((TRACE_HEADER, trace_id.encode()))
                    message = {**message, "headers": headers}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True

        client = ClientPresence(receive, send_wrapper)
        self.metrics.activity.started()
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, client.receive, client.send)
        finally:
            self.metrics.activity.ended()
            self.metrics.in_flight.dec()
            code = CLIENT_CLOSED_REQUEST if client.left and not answered else status["code"]
            self.metrics.count_request(self.route_label(scope), scope["method"], code)
