"""The error envelope's model and the error responses every operation declares."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from chatqna.api.error_schemas import ErrorEnvelope
from chatqna.errors import (
    CondenseFailed,
    ContextTooLong,
    InternalError,
    InvalidRequest,
    UpstreamTimeout,
)
from tests.unit.api.conftest import ClientFactory

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "envelope",
    [
        InternalError().envelope(),
        InvalidRequest("bad", details=[{"field": "k", "message": "no"}]).envelope(),
        ContextTooLong("too long").envelope(),
        CondenseFailed("timeout").envelope(),
        UpstreamTimeout("slow", backend="llm").envelope(),
    ],
)
def test_the_published_envelope_describes_every_envelope_whole(envelope: dict[str, Any]) -> None:
    # Read back through the model and written out again: no key it does not declare, and
    # none it would add (`reason`, `details` and `backend` only where an error has them).
    assert ErrorEnvelope.model_validate(envelope).model_dump(exclude_unset=True) == envelope


@pytest.mark.parametrize("role", ["megaservice", "retriever"])
async def test_every_operation_declares_the_refusals_any_route_can_get(
    client_for: ClientFactory, role: Literal["megaservice", "retriever"]
) -> None:
    """A `Host` the service does not answer to (400 `invalid_host`), a body too large and
    a failure come before or beside any route, the health checks included."""
    client = await client_for(role=role)
    document = (await client.get("/openapi.json")).json()
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert operations
    for operation in operations:
        responses = operation["responses"]
        assert {"400", "413", "500"} <= responses.keys(), operation["operationId"]
        assert "`invalid_host`" in responses["400"]["description"]
        envelope = responses["400"]["content"]["application/json"]["schema"]["$ref"]
        assert envelope.endswith("/ErrorEnvelope")
