"""`.env.example` documents exactly the variables `Settings` reads, each with a comment."""

from __future__ import annotations

import re
from pathlib import Path

from chatqna.settings import Settings

ENV_EXAMPLE = Path(__file__).resolve().parents[2] / ".env.example"


def documented() -> dict[str, str]:
    """Variable -> the comment line just above it, for the service's part of the file.

    The compose-only section at the end is checked by `tests/repo/test_deploy_static.py`.
    """
    lines = ENV_EXAMPLE.read_text().splitlines()
    found = {}
    for number, line in enumerate(lines):
        if line.startswith("#") and "docker compose only" in line:
            break
        match = re.match(r"^([A-Z][A-Z0-9_]*)=", line)
        if match:
            found[match.group(1)] = lines[number - 1] if number else ""
    return found


def test_every_setting_is_documented_and_nothing_else() -> None:
    settings = {name.upper() for name in Settings.model_fields}
    assert set(documented()) == settings


def test_every_variable_has_an_explanation() -> None:
    for name, comment in documented().items():
        assert comment.startswith("# ") and len(comment) > 10, name


def test_documented_defaults_parse() -> None:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if re.match(r"^[A-Z][A-Z0-9_]*=", line):
            key, _, value = line.partition("=")
            values[key.lower()] = value
    settings = Settings(**{k: v for k, v in values.items() if v != ""})
    assert settings.mega_service_port == Settings().mega_service_port
    assert settings.multi_turn_blend_alpha == Settings().multi_turn_blend_alpha
