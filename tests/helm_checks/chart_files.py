"""The chart's own files: values.yaml against the settings, .env.example and the README."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.deploy_checks import Problem, container_variables, parse_env_example
from tests.helm_checks.helm import CHART, REPO

TABLE_KEY = re.compile(r"^\|\s*`(?P<key>[A-Za-z0-9_.\[\]-]+)`\s*\|", re.M)


def documented_keys(readme: str) -> set[str]:
    """Keys in the first column of the README's values table(s), in backticks."""
    return {match["key"] for match in TABLE_KEY.finditer(readme)}


def _has_path(values: Mapping[str, Any], dotted: str) -> bool:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def values_doc_problems(values: Mapping[str, Any], readme: str) -> list[Problem]:
    """Every top-level key is documented; every documented key exists."""
    documented = documented_keys(readme)
    problems = [
        Problem("undocumented_value", "values.yaml", key)
        for key in values
        if not any(d == key or d.startswith(f"{key}.") for d in documented)
    ]
    problems += [
        Problem("stale_value_doc", "README.md", key)
        for key in sorted(documented)
        if not _has_path(values, key)
    ]
    return problems


def config_problems(values: Mapping[str, Any], env_example: str) -> list[Problem]:
    """values.yaml's `config` keys are settings (or the OpenTelemetry SDK's variables), with
    the defaults .env.example gives them."""
    known = container_variables()
    documented = parse_env_example(env_example).settings
    problems = []
    for key, value in (values.get("config") or {}).items():
        if key not in known:
            problems.append(Problem("unknown_setting", "values.yaml:config", key))
        elif key in documented and str(value) != documented[key]:
            problems.append(
                Problem(
                    "default_mismatch",
                    f"values.yaml:config.{key}",
                    f"{value!r} vs .env.example {documented[key]!r}",
                )
            )
    return problems


def chart_file_problems(chart: Path = CHART, repo: Path = REPO) -> list[Problem]:
    values = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
    readme = (chart / "README.md").read_text(encoding="utf-8")
    env_example = (repo / ".env.example").read_text(encoding="utf-8")
    return values_doc_problems(values, readme) + config_problems(values, env_example)
