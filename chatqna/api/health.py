"""Health endpoints, open without the API key: liveness and per-backend readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from chatqna import __version__
from chatqna.api.deps import State
from chatqna.api.error_schemas import ANY_ROUTE, error_responses
from chatqna.api.health_schemas import HealthStatus, Readiness
from chatqna.telemetry.client_spans import untraced_calls

router = APIRouter(tags=["health"], responses=error_responses(*ANY_ROUTE))


@router.get("/v1/health_check", summary="Liveness: the process is up", response_model=HealthStatus)
async def health_check() -> dict[str, Any]:
    return {"status": "ok", "service": "chatqna", "version": __version__}


@router.get(
    "/v1/ready",
    summary="Readiness: every backend answers",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Some backend is not ready"}},
)
async def ready(state: State) -> JSONResponse:
    with untraced_calls():
        backends = await state.backends.describe()
    is_ready = all(item.get("ready") for item in backends.values())
    body = {"status": "ready" if is_ready else "unready", "backends": backends}
    return JSONResponse(status_code=200 if is_ready else 503, content=body)
