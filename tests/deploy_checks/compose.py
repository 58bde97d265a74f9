"""Compose files: loading, the variables they read, interpolation, merging an override file,
and the environment a service's container gets."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

INTERPOLATION = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_]\w*))")
BRACED = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:(?P<op>:-|-|:\?|\?|:\+|\+)(?P<arg>.*))?$", re.S)


# --- compose: loading, interpolation, merging ----------------------------------------------


def load_yaml(text: str) -> Any:
    return yaml.safe_load(text)


@dataclass(frozen=True)
class Reference:
    """A variable a compose file reads: `${NAME...}` in a value, or a pass-through entry."""

    name: str
    where: str
    default: str | None = None  # the text after `:-` or `-`
    passthrough: bool = False


def _strings(node: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield where, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{where}[{index}]")


def references(doc: Mapping[str, Any], file: str) -> list[Reference]:
    """Every variable `doc` reads, in values and in valueless `environment` entries."""
    found = []
    for where, text in _strings(doc, file):
        for match in INTERPOLATION.finditer(text):
            if match["escaped"]:
                continue
            if match["named"]:
                found.append(Reference(match["named"], where))
                continue
            braced = BRACED.match(match["braced"])
            if braced is None:
                found.append(Reference(match["braced"], where))
                continue
            op = braced["op"]
            default = braced["arg"] if op in (":-", "-") else None
            found.append(Reference(braced["name"], where, default))
    for name, service in (doc.get("services") or {}).items():
        for key, value in environment_entries(service):
            if value is None:
                found.append(Reference(key, f"{file}.services.{name}.environment", None, True))
    return found


def environment_entries(service: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """A service's environment as (name, value or None for a pass-through) pairs."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs: list[tuple[str, str | None]] = []
        for item in env:
            name, equals, value = str(item).partition("=")
            pairs.append((name, value if equals else None))
        return pairs
    return [(str(k), None if v is None else str(v)) for k, v in env.items()]


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's substitution of `$VAR`, `${VAR}`, `${VAR:-d}`, `${VAR-d}`, `${VAR:+a}`, `$$`."""

    def one(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["named"]:
            return env.get(match["named"], "")
        braced = BRACED.match(match["braced"])
        if braced is None:
            return ""
        name, op, arg = braced["name"], braced["op"], braced["arg"] or ""
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return value if value is not None else arg
        if op == ":+":
            return arg if value else ""
        if op == "+":
            return arg if value is not None else ""
        return value or ""

    return INTERPOLATION.sub(one, text)


def interpolate_doc(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, Mapping):
        return {key: interpolate_doc(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_doc(value, env) for value in node]
    return node


def merge(base: Any, override: Any) -> Any:
    """Override files on top of the base: mappings merge key by key, anything else is replaced."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    return override


# --- settings as a container sees them -----------------------------------------------------


def container_environment(
    doc: Mapping[str, Any], service: str, env: Mapping[str, str]
) -> dict[str, str]:
    """The environment a service's container gets, with `env` as the project's .env.

    `doc` is not interpolated yet; pass-through entries take their value from `env` and
    are left out when `env` does not set them, as compose does.
    """
    result = {}
    for key, value in environment_entries(doc["services"][service]):
        if value is None:
            if key in env:
                result[key] = env[key]
        else:
            result[key] = interpolate(value, env)
    return result
