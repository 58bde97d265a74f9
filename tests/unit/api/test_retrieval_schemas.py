"""The retrieval endpoint's wire models: the fusion weights a request may carry, and the
retriever service's OpenAPI document."""

from __future__ import annotations

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator
from pydantic import ValidationError

from chatqna.api.retrieval_schemas import RetrievalRequest
from chatqna.app import create_app
from chatqna.settings import Settings
from tests.unit.conftest import TRACER_PROVIDER


def test_fusion_weights_may_silence_a_leg() -> None:
    request = RetrievalRequest.model_validate({"text": "refunds", "fusion_weights": [1.0, 0.0]})
    assert request.fusion_weights == (1.0, 0.0)
    assert request.k == 4


@pytest.mark.parametrize("weights", [[1.0, float("inf")], [-0.5, 1.0], [1.0]])
def test_a_weight_that_would_spoil_the_fusion_is_refused(weights: list[float]) -> None:
    # An infinite weight makes every fused score NaN; a negative one ranks a leg backwards.
    with pytest.raises(ValidationError):
        RetrievalRequest.model_validate({"text": "refunds", "fusion_weights": weights})


def test_the_retriever_services_openapi_document_is_valid() -> None:
    app = create_app(Settings(), tracer_provider=TRACER_PROVIDER, role="retriever")
    OpenAPIV31SpecValidator(app.openapi()).validate()
