"""Variables: every `${VAR}` and every pass-through environment entry of the compose files is
documented in `.env.example` (a pass-through one may be shown commented out); every
documented variable is a setting or is used by a compose file; every setting is documented,
and reaches a ChatQnA container unless it is in `NOT_PASSED` with a reason; defaults agree
between the compose files and `.env.example`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.deploy_checks.compose import Reference, references
from tests.deploy_checks.files import COMPOSE_FILE, ENV_EXAMPLE, Problem
from tests.deploy_checks.settings_env import EnvExample, all_setting_variables

# Settings no compose service hands to a container, and why. Everything else must reach one.
NOT_PASSED = {
    "CHATQNA_HOST": "the image listens on 0.0.0.0; .env.example's 127.0.0.1 is for a local run",
    "CHATQNA_DATA_DIR": "the image keeps its data in /data, a volume",
    "CHATQNA_LLM_GGUF": "a path inside the container: mount the file in an override file",
}


# --- variables -----------------------------------------------------------------------------


def _reference_problems(
    refs: list[Reference], documented: Mapping[str, str], commented: Mapping[str, str]
) -> list[Problem]:
    """Each reference is documented, has a default, and the defaults agree. A pass-through
    may be documented commented out, and so may a variable compose gives a default (the
    commented value is then that default)."""
    problems = []
    defaults: dict[str, set[str]] = {}
    for ref in refs:
        given = documented.get(ref.name)
        if given is None and ref.default is not None:
            given = commented.get(ref.name)
        if given is None and not (ref.passthrough and ref.name in commented):
            problems.append(
                Problem("undocumented_variable", ref.where, f"{ref.name} is not in .env.example")
            )
        if ref.passthrough:
            continue
        if ref.default is None:
            problems.append(
                Problem("no_default", ref.where, f"{ref.name} has no default (${{VAR:-default}})")
            )
            continue
        defaults.setdefault(ref.name, set()).add(ref.default)
        if given and ref.default != given:
            problems.append(
                Problem(
                    "default_mismatch",
                    ref.where,
                    f"{ref.name} defaults to {ref.default!r}, .env.example says {given!r}",
                )
            )
    for name, values in sorted(defaults.items()):
        if len(values) > 1:
            problems.append(Problem("default_mismatch", name, f"defaults differ: {sorted(values)}"))
    return problems


def _env_example_problems(env: EnvExample, settings: set[str], used: set[str]) -> list[Problem]:
    """Each documented variable is a setting (first part) or read by compose (compose part)."""
    problems = [
        Problem("unknown_setting", ENV_EXAMPLE, f"{name} is not read by the service")
        for name in sorted(env.settings)
        if name not in settings
    ]
    for name in sorted(env.compose):
        if name in settings:
            problems.append(
                Problem(
                    "misplaced_variable",
                    ENV_EXAMPLE,
                    f"{name} is a setting; document it above the compose section",
                )
            )
        elif name not in used:
            problems.append(
                Problem("unused_variable", ENV_EXAMPLE, f"{name}: no compose file reads it")
            )
    return problems


def _setting_problems(
    env: EnvExample, settings: set[str], used: set[str], not_passed: Mapping[str, str]
) -> list[Problem]:
    """Each setting is documented and reaches a container, unless excluded with a reason."""
    problems = []
    for name in sorted(settings):
        if name not in env.settings:
            problems.append(Problem("setting_not_documented", ENV_EXAMPLE, f"{name} is missing"))
        if name not in used and name not in not_passed:
            problems.append(
                Problem(
                    "setting_not_in_compose",
                    COMPOSE_FILE,
                    f"{name} reaches no container (pass it, or list it in NOT_PASSED)",
                )
            )
        if name in used and name in not_passed:
            problems.append(Problem("stale_exclusion", "NOT_PASSED", f"{name} is passed after all"))
    return problems


def variable_problems(
    docs: Mapping[str, Mapping[str, Any]],
    env: EnvExample,
    settings: set[str] | None = None,
    not_passed: Mapping[str, str] = NOT_PASSED,
) -> list[Problem]:
    """Compose variables, `.env.example` and the settings describe the same variables."""
    settings = all_setting_variables() if settings is None else settings
    refs = [ref for file, doc in docs.items() for ref in references(doc, file)]
    used = {ref.name for ref in refs}
    return (
        _reference_problems(refs, env.values, env.commented)
        + _env_example_problems(env, settings, used)
        + _setting_problems(env, settings, used, not_passed)
    )
