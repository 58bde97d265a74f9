"""Names and label values within what Kubernetes accepts, also with Helm's longest release."""

from __future__ import annotations

from tests.deploy_checks import Problem
from tests.helm_checks.manifests import Manifest, name_of

# Helm's longest release name; a StatefulSet's name plus "-" and a revision hash of up to 10
# characters is its pods' controller-revision-hash label, at most 63 characters.
LONGEST_RELEASE = 53
STATEFULSET_NAME_LIMIT = 52
LABEL_LIMIT = 63


def name_length_problems(docs: list[Manifest]) -> list[Problem]:
    """Names and label values Kubernetes accepts and can build on: StatefulSets within 52
    characters, Services and label values within 63."""
    problems = []
    for doc in docs:
        name = doc["metadata"]["name"]
        limit = {"StatefulSet": STATEFULSET_NAME_LIMIT, "Service": LABEL_LIMIT}.get(doc["kind"])
        if limit is not None and len(name) > limit:
            problems.append(Problem("name_length", name_of(doc), f"{len(name)} > {limit}"))
        for value in (doc["metadata"].get("labels") or {}).values():
            if len(str(value)) > LABEL_LIMIT:
                problems.append(Problem("label_length", name_of(doc), str(value)))
    return problems
