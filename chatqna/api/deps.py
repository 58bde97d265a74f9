"""Request dependencies: the running service's state, and the optional API key check.

The key is enforced for every path by `chatqna.api.guards.ApiKeyGuard`; `require_api_key`
repeats the check on the routers that serve data, so a path wrongly listed as public still
refuses them. Both check it with `chatqna.api.api_key.request_has_key`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated

from fastapi import Depends, Request

from chatqna.api.api_key import API_KEY_REQUIRED, request_has_key
from chatqna.api.origins import own_host_names
from chatqna.backends.bundle import Backends
from chatqna.errors import Unauthorized
from chatqna.ingest.parse_pool import ParsePool
from chatqna.pipeline.orchestrator import Pipeline
from chatqna.settings import Settings
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.observer import TurnTelemetry


@dataclass
class ServiceState:
    """What every handler needs: the settings, the live backends, the chat pipeline, and
    the threads dataprep parses on."""

    settings: Settings
    backends: Backends
    metrics: ServiceMetrics
    parse_pool: ParsePool = field(default_factory=ParsePool)

    @cached_property
    def pipeline(self) -> Pipeline:
        """Built on first use, once: the multi-turn strategy and the turn observer."""
        observer = TurnTelemetry(self.metrics, self.settings.chatqna_trace_content)
        return Pipeline.build(self.settings, self.backends, observer)


# Dependencies are `async def` so FastAPI runs them on the loop, not on a worker thread.
async def service_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


async def require_api_key(request: Request) -> None:
    """With `CHATQNA_API_KEY` set, demand the key (Bearer, or Basic from this origin)."""
    settings: Settings = request.app.state.settings
    if settings.chatqna_api_key is None:
        return
    own_hosts = own_host_names(settings.chatqna_allowed_hosts)
    if not request_has_key(request.scope, settings.chatqna_api_key, own_hosts=own_hosts):
        raise Unauthorized(API_KEY_REQUIRED)


State = Annotated[ServiceState, Depends(service_state)]
