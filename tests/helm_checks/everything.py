"""Every check: of one set of rendered manifests, and of the chart with each values file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.deploy_checks import Problem
from tests.helm_checks.chart_files import chart_file_problems
from tests.helm_checks.containers import probe_problems, security_problems, settings_problems
from tests.helm_checks.helm import (
    CHART,
    OLDEST_KUBERNETES_VERSION,
    VALUES_FILES,
    RenderError,
    lint_problems,
    render,
)
from tests.helm_checks.lifecycle import (
    startup_wait_problems,
    termination_problems,
    wait_script_problems,
)
from tests.helm_checks.manifests import Manifest
from tests.helm_checks.monitoring import (
    grafana_problems,
    scrape_auth_problems,
    scrape_coverage_problems,
)
from tests.helm_checks.names import LONGEST_RELEASE, name_length_problems
from tests.helm_checks.schema import schema_problems
from tests.helm_checks.wiring import proxy_problems, reference_problems, url_problems


def manifest_problems(
    docs: list[Manifest],
    external_secrets: Iterable[str] = (),
    keyless_secrets: Iterable[str] = (),
) -> list[Problem]:
    """Every check of rendered manifests. `external_secrets`: Secrets the release uses but does
    not render; `keyless_secrets`: those of them without CHATQNA_API_KEY."""
    return (
        schema_problems(docs)
        + probe_problems(docs)
        + settings_problems(docs)
        + security_problems(docs)
        + url_problems(docs)
        + reference_problems(docs, external_secrets)
        + grafana_problems(docs)
        + scrape_auth_problems(docs, keyless_secrets)
        + scrape_coverage_problems(docs)
        + termination_problems(docs)
        + startup_wait_problems(docs)
        + wait_script_problems(docs)
        + name_length_problems(docs)
    )


def chart_problems(helm: Path, chart: Path = CHART) -> list[Problem]:
    problems = chart_file_problems(chart)
    for files in ((), *((chart / name,) for name in VALUES_FILES)):
        label = files[0].name if files else "values.yaml"
        problems += lint_problems(helm, files, chart)
        try:
            docs = render(helm, files, chart=chart)
        except RenderError as error:
            problems.append(Problem("render", label, str(error)))
            continue
        found = (
            manifest_problems(docs)
            + schema_problems(docs, OLDEST_KUBERNETES_VERSION)
            + proxy_problems(docs)  # of the chart's defaults: an operator's NO_PROXY is theirs
        )
        problems += [Problem(p.kind, f"{label}:{p.where}", p.detail) for p in found]
    try:
        long_names = render(helm, chart=chart, release="r" * LONGEST_RELEASE)
    except RenderError as error:
        return [*problems, Problem("render", "longest release name", str(error))]
    found = name_length_problems(long_names)
    return problems + [Problem(p.kind, f"longest release name:{p.where}", p.detail) for p in found]
