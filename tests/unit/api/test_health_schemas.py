"""The health endpoints' wire models describe the bodies sent, whole."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from chatqna.api.health_schemas import HealthStatus, Readiness
from tests.unit.api.conftest import ClientFactory

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("path", "model"), [("/v1/health_check", HealthStatus), ("/v1/ready", Readiness)]
)
async def test_each_body_is_its_published_model(
    client_for: ClientFactory, path: str, model: type[BaseModel]
) -> None:
    client = await client_for()
    body = (await client.get(path)).json()
    # Read back through the model and written out again: no key it does not declare.
    assert model.model_validate(body, strict=True).model_dump() == body
