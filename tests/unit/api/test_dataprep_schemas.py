"""The dataprep endpoints' wire models: the delete request, and the ingest form as published."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chatqna.api.dataprep_schemas import DataprepDeleteRequest
from tests.unit.api.conftest import ClientFactory

pytestmark = pytest.mark.anyio


def test_a_delete_names_a_source_or_all() -> None:
    assert DataprepDeleteRequest.model_validate({"file_path": "all"}).file_path == "all"
    with pytest.raises(ValidationError):
        DataprepDeleteRequest.model_validate({"file_path": ""})


async def test_the_ingest_forms_optional_fields_are_published_without_null(
    client_for: ClientFactory,
) -> None:
    """A form field is absent or a string: `null` is nothing a client can send."""
    client = await client_for()
    document = (await client.get("/openapi.json")).json()
    body = document["paths"]["/v1/dataprep/ingest"]["post"]["requestBody"]
    ref = body["content"]["multipart/form-data"]["schema"]["$ref"]
    form = document["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"]
    assert form["link_list"]["type"] == "string"
    assert (form["chunk_size"]["type"], form["chunk_size"]["minimum"]) == ("integer", 100)
    assert (form["chunk_overlap"]["type"], form["chunk_overlap"]["maximum"]) == ("integer", 10000)
    for field in ("link_list", "chunk_size", "chunk_overlap"):
        assert "anyOf" not in form[field], field
