"""The chart rendered and linted offline by `helm`, with the binary scripts/k8s-tools installs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.deploy_checks import Problem
from tests.helm_checks.manifests import Manifest

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "chatqna"
TOOLS = REPO / "scripts" / "k8s-tools"
KUBERNETES_VERSION = "1.37.0"
# The oldest version Chart.yaml's kubeVersion admits: the manifests must validate there too.
OLDEST_KUBERNETES_VERSION = "1.29.0"
RELEASE = "rel"
NAMESPACE = "chatqna"
# The values files shipped beside values.yaml; each must render and validate.
VALUES_FILES = ("values-redis-cluster.yaml", "values-embedded.yaml")


def helm_binary() -> Path:
    """The helm binary, installed (once, cached) by scripts/k8s-tools."""
    result = subprocess.run(
        [str(TOOLS), "paths"], capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"scripts/k8s-tools paths failed:\n{result.stderr}")
    return Path(result.stdout.strip())


class RenderError(RuntimeError):
    """`helm template` failed; the message is helm's."""


def _helm_errors(stderr: str) -> str:
    """helm's stderr without its notes on the chart's symbolic link (files/grafana)."""
    return "\n".join(
        line for line in stderr.strip().splitlines() if "found symbolic link" not in line
    )


def _value_args(values: Iterable[Path], sets: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for path in values:
        args += ["--values", str(path)]
    for key, value in sets.items():
        # Strings stay strings ("false" would be truthy in a template); bools and numbers not.
        if isinstance(value, bool):
            args += ["--set", f"{key}={str(value).lower()}"]
        else:
            args += ["--set-string" if isinstance(value, str) else "--set", f"{key}={value}"]
    return args


def render_text(
    helm: Path,
    values: Iterable[Path] = (),
    sets: Mapping[str, Any] | None = None,
    chart: Path = CHART,
    release: str = RELEASE,
) -> str:
    command = [
        str(helm),
        "template",
        release,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBERNETES_VERSION,
        *_value_args(values, sets or {}),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise RenderError(_helm_errors(result.stderr))
    return result.stdout


def parse_manifests(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(
    helm: Path,
    values: Iterable[Path] = (),
    sets: Mapping[str, Any] | None = None,
    chart: Path = CHART,
    release: str = RELEASE,
) -> list[Manifest]:
    return parse_manifests(render_text(helm, values, sets, chart, release))


def lint_problems(helm: Path, values: Iterable[Path] = (), chart: Path = CHART) -> list[Problem]:
    result = subprocess.run(
        [str(helm), "lint", "--strict", str(chart), *_value_args(values, {})],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode == 0:
        return []
    return [Problem("lint", chart.name, f"{result.stdout.strip()}\n{_helm_errors(result.stderr)}")]
