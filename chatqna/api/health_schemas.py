"""The health endpoints' wire models: `GET /v1/health_check` and `GET /v1/ready`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class HealthStatus(BaseModel):
    """Body of `GET /v1/health_check`."""

    status: Literal["ok"]
    service: str
    version: str


class Readiness(BaseModel):
    """Body of `GET /v1/ready`: 200 when every backend is ready, else 503."""

    status: Literal["ready", "unready"]
    backends: dict[str, dict[str, Any]]
