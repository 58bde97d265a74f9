"""Fuzz every operation of the published OpenAPI schema, for both app roles.

Schemathesis reads the app's own OpenAPI document and sends generated requests (valid
ones and deliberately invalid ones) over ASGI, with no network. Every response must be a
non-5xx whose status code, content type and body are the ones the schema declares. The
app runs on the fast fake backends, and Hypothesis is derandomized with a bounded number
of examples per operation, so the run is reproducible and takes seconds.

The schema is read at import from an app that has not started (its shape does not depend
on the backends); each test then sends its cases to a started app on fresh fakes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from pydantic import SecretStr
from schemathesis.checks import CheckFunction
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import positive_data_acceptance, unsupported_method

from chatqna.app import create_app
from chatqna.settings import Settings
from tests.unit.api.conftest import make_backends
from tests.unit.conftest import TRACER_PROVIDER

Role = Literal["megaservice", "retriever"]
API_KEY = "fuzz-key"
# A name the service answers to when bound to loopback, as it is by default (schemathesis
# would send `Host: testserver`).
BASE_URL = "http://localhost:8888"
FUZZ_SETTINGS = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    # The app fixture is deliberately shared by every example of an operation.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Operations with rules JSON Schema cannot state, so a schema-valid request may rightly get a
# 4xx; every other check still runs on them, and invalid data must still be rejected.
RULES_BEYOND_THE_SCHEMA = {
    "POST /v1/chatqna": "a non-empty last user message; max_tokens within LLM_MAX_TOKENS_LIMIT",
    "POST /v1/chat/completions": (
        "a non-empty last user message; max_tokens within LLM_MAX_TOKENS_LIMIT"
    ),
    "POST /v1/dataprep/ingest": "a file or a link; chunk_overlap < chunk_size; readable files",
    "POST /v1/retrieval": "an embedding must have the index's dimension and be non-zero",
}


def _excluded_checks(case: schemathesis.Case) -> list[CheckFunction]:
    label = f"{case.operation.method.upper()} {case.operation.path}"
    return [positive_data_acceptance] if label in RULES_BEYOND_THE_SCHEMA else []


def _published_schema(role: Role) -> Any:
    app = create_app(Settings(), tracer_provider=TRACER_PROVIDER, role=role)
    return schemathesis.openapi.from_dict(app.openapi())


megaservice = _published_schema("megaservice")
retriever = _published_schema("retriever")


def _started_app(data_dir: Path, role: Role, **overrides: Any) -> Iterator[FastAPI]:
    chosen = Settings(chatqna_data_dir=data_dir, **overrides)
    backends = asyncio.run(make_backends(chosen))
    yield create_app(chosen, backends, tracer_provider=TRACER_PROVIDER, role=role)
    shutdown_lifespans()  # schemathesis's ASGI transport started the app on its first request


@pytest.fixture
def megaservice_app(tmp_path: Path) -> Iterator[FastAPI]:
    yield from _started_app(tmp_path / "data", "megaservice")


@pytest.fixture
def retriever_app(tmp_path: Path) -> Iterator[FastAPI]:
    yield from _started_app(tmp_path / "data", "retriever")


@pytest.fixture
def keyed_app(tmp_path: Path) -> Iterator[FastAPI]:
    yield from _started_app(tmp_path / "data", "megaservice", chatqna_api_key=SecretStr(API_KEY))


@megaservice.parametrize()
@FUZZ_SETTINGS
def test_megaservice_operations_honour_their_schema(
    case: schemathesis.Case, megaservice_app: FastAPI
) -> None:
    case.call_and_validate(
        app=megaservice_app, base_url=BASE_URL, excluded_checks=_excluded_checks(case)
    )


@retriever.parametrize()
@FUZZ_SETTINGS
def test_retriever_operations_honour_their_schema(
    case: schemathesis.Case, retriever_app: FastAPI
) -> None:
    case.call_and_validate(
        app=retriever_app, base_url=BASE_URL, excluded_checks=_excluded_checks(case)
    )


@megaservice.parametrize()
@FUZZ_SETTINGS
def test_keyed_operations_honour_their_schema_with_and_without_the_key(
    case: schemathesis.Case, keyed_app: FastAPI
) -> None:
    keyed = case.call_and_validate(
        app=keyed_app,
        base_url=BASE_URL,
        headers={"Authorization": f"Bearer {API_KEY}"},
        excluded_checks=_excluded_checks(case),
    )
    anonymous = case.call(app=keyed_app, base_url=BASE_URL)
    # Without the key even a wrong method may get 401: the routes are nobody else's business.
    case.validate_response(
        anonymous, excluded_checks=[positive_data_acceptance, unsupported_method]
    )
    # Health stays open. Elsewhere only a body that cannot be parsed at all (400) or a wrong
    # method (405) is answered before the key is looked at, with what a keyed client gets.
    if not case.path.startswith(("/v1/health", "/v1/ready")):
        assert anonymous.status_code == 401 or anonymous.status_code == keyed.status_code in {
            400,
            405,
        }, anonymous.text
