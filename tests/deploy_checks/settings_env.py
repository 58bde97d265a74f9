"""What a ChatQnA container may be given (the settings, OpenTelemetry's variables, the
process's own), and `.env.example` split into the service's settings and the compose-only
variables."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import AliasChoices, AliasPath

from chatqna.settings import Settings

COMPOSE_SECTION_MARKER = "docker compose only"
ASSIGNMENT = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")


# --- settings ------------------------------------------------------------------------------


def settings_env_names() -> dict[str, set[str]]:
    """Field name -> the environment variables that set it (aliases included)."""
    config = Settings.model_config
    prefix = str(config.get("env_prefix", ""))
    upper = not config.get("case_sensitive", False)
    names: dict[str, set[str]] = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias if info.validation_alias is not None else info.alias
        if isinstance(alias, str):
            found = {alias}
        elif isinstance(alias, AliasChoices):
            found = {c for c in alias.choices if isinstance(c, str)}
            found |= {str(c.path[0]) for c in alias.choices if isinstance(c, AliasPath)}
        elif isinstance(alias, AliasPath):
            found = {str(alias.path[0])}
        else:
            found = {prefix + name}
        names[name] = {n.upper() if upper else n for n in found}
    return names


def all_setting_variables() -> set[str]:
    return set().union(*settings_env_names().values())


def sdk_variables() -> set[str]:
    """The `OTEL_*` variables OpenTelemetry's SDK and API read themselves (a container may
    set them): the API's own include `OTEL_PROPAGATORS`."""
    import opentelemetry.environment_variables as api_environment
    import opentelemetry.sdk.environment_variables as sdk_environment

    return {
        name
        for module in (sdk_environment, api_environment)
        for name in dir(module)
        if name.startswith("OTEL_")
    }


# Variables of the container's process that neither the settings nor OpenTelemetry read: the
# server's and the HTTP clients'.
PROCESS_VARIABLES = {
    "FORWARDED_ALLOW_IPS": "uvicorn: the proxies whose X-Forwarded-* headers are trusted",
    "HTTP_PROXY": "the HTTP clients (httpx2, the OTLP exporter's requests)",
    "HTTPS_PROXY": "the HTTP clients",
    "NO_PROXY": "the HTTP clients",
    "no_proxy": "the HTTP clients: NO_PROXY's lower-case twin, read where both are set",
}

# The variables that keep a ChatQnA container's calls into the stack off a proxy.
PROXY_BYPASS = ("NO_PROXY", "no_proxy")


def container_variables() -> set[str]:
    """What a ChatQnA container may be given: the settings, OpenTelemetry's variables and
    `PROCESS_VARIABLES`."""
    return all_setting_variables() | sdk_variables() | set(PROCESS_VARIABLES)


# --- .env.example --------------------------------------------------------------------------


@dataclass
class EnvExample:
    """`.env.example`, split into the service's settings and the compose-only variables."""

    settings: dict[str, str] = field(default_factory=dict)
    compose: dict[str, str] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)
    # `# NAME=example` lines: variables shown commented out, unset unless the operator sets
    # them (a copied `NAME=` would set them empty, which the SDK does not read as unset).
    commented: dict[str, str] = field(default_factory=dict)

    @property
    def values(self) -> dict[str, str]:
        return {**self.settings, **self.compose}


def parse_env_example(text: str) -> EnvExample:
    found = EnvExample()
    section = found.settings
    previous = ""
    for line in text.splitlines():
        if line.startswith("#") and COMPOSE_SECTION_MARKER in line:
            section = found.compose
        match = ASSIGNMENT.match(line)
        if match:
            section[match["name"]] = match["value"]
            found.comments[match["name"]] = previous
        elif match := ASSIGNMENT.match(line.removeprefix("# ")):
            found.commented[match["name"]] = match["value"]
        previous = line
    return found
