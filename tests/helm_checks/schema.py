"""Rendered manifests against the Kubernetes OpenAPI schemas, unknown fields rejected."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

from tests.deploy_checks import Problem
from tests.helm_checks.helm import KUBERNETES_VERSION
from tests.helm_checks.manifests import Manifest, name_of


@functools.lru_cache(maxsize=4096)
def _validate(text: str, version: str) -> tuple[Problem, ...]:
    """One manifest (as canonical JSON) against the schemas; remembered, since reading a
    schema file takes far longer than checking a manifest against it."""
    import kubernetes_validate.utils as validation

    doc = json.loads(text)
    try:
        validation.validate(doc, version, strict=True)
    except validation.ValidationError as error:
        path = ".".join(str(p) for p in error.path) or "(top)"
        return (Problem("schema", f"{name_of(doc)}:{path}", error.message),)
    except validation.SchemaNotFoundError as error:
        return (Problem("schema", name_of(doc), error.message),)
    return ()


def schema_problems(docs: Iterable[Manifest], version: str = KUBERNETES_VERSION) -> list[Problem]:
    """Each manifest against the pinned Kubernetes version's schemas, unknown fields rejected."""
    return [p for doc in docs for p in _validate(json.dumps(doc, sort_keys=True), version)]
