"""The compose files validate against the Compose Specification JSON schema. The schema
comes from the `check-jsonschema` package (a pinned test dependency, which vendors the
schema of the compose-spec project, Apache-2.0), with its SHA-256 pinned here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from tests.deploy_checks.files import Problem

SCHEMA_PACKAGE = "check_jsonschema.builtin_schemas.vendor"
SCHEMA_FILE = "compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"


# --- the schema ----------------------------------------------------------------------------


def compose_schema_text() -> str:
    return (resources.files(SCHEMA_PACKAGE) / SCHEMA_FILE).read_text(encoding="utf-8")


def compose_schema() -> dict[str, Any]:
    text = compose_schema_text()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != SCHEMA_SHA256:
        raise RuntimeError(f"{SCHEMA_FILE} has SHA-256 {digest}, expected {SCHEMA_SHA256}")
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_problems(doc: Any, schema: Mapping[str, Any], where: str) -> list[Problem]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    return [
        Problem(
            "schema",
            f"{where}:{'.'.join(str(p) for p in error.absolute_path) or '(top)'}",
            error.message,
        )
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]
