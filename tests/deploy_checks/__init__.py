"""Static checks of the deployment files: compose files, `.env.example`, Dockerfile.

Every check is a function that takes the parsed files and returns a list of `Problem`s, so
the tests run it on the repository's files and on copies with a planted mistake. Nothing
here uses the network or a Docker engine. From the repository root,
`.venv/bin/python -m tests.deploy_checks` prints the repository's problems.

The checks live in modules named for what they look at: `files` (the files' paths and
`Problem`), `settings_env` (the settings and `.env.example`), `compose` (loading,
interpolation, merging), `schema`, `variables`, `wiring`, `dockerfile`, and `everything`
(all of them, on the repository); this package exports their public names.

What is checked:

- The compose files validate against the Compose Specification JSON schema. The schema
  comes from the `check-jsonschema` package (a pinned test dependency, which vendors the
  schema of the compose-spec project, Apache-2.0), with its SHA-256 pinned here.
- Variables: every `${VAR}` and every pass-through environment entry of the compose files is
  documented in `.env.example` (a pass-through one may be shown commented out); every
  documented variable is a setting or is used by a compose file; every setting is
  documented, and reaches a ChatQnA container unless it is in `NOT_PASSED` with a reason;
  defaults agree between the compose files and `.env.example`.
- Wiring: ChatQnA containers listen on the settings' default ports, every URL they (and the
  Grafana and scrape configs) are given names a compose service and a port it listens on,
  they wait for those services to be healthy, each one the stack starts by default is a
  target of the scrape config on its role's port, their `NO_PROXY` and `no_proxy` name every
  service they call, and bind mounts and volumes exist.
- The Dockerfile: multi-stage, a non-root user, a health check on `/v1/health_check`, the
  settings' ports exposed, every `COPY` source present and not excluded by `.dockerignore`,
  the same GGUF package pin as `scripts/setup-venv`; and every data file of the `chatqna`
  package is package data, since the image installs a wheel.
"""

from tests.deploy_checks.compose import (
    BRACED,
    INTERPOLATION,
    Reference,
    container_environment,
    environment_entries,
    interpolate,
    interpolate_doc,
    load_yaml,
    merge,
    references,
)
from tests.deploy_checks.dockerfile import (
    Instruction,
    dockerfile_problems,
    dockerignore_patterns,
    is_ignored,
    package_data_problems,
    parse_dockerfile,
)
from tests.deploy_checks.everything import repository_problems
from tests.deploy_checks.files import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    OVERRIDE_FILES,
    REPO,
    SCRAPE_CONFIG,
    Problem,
)
from tests.deploy_checks.schema import (
    SCHEMA_FILE,
    SCHEMA_PACKAGE,
    SCHEMA_SHA256,
    compose_schema,
    compose_schema_text,
    schema_problems,
)
from tests.deploy_checks.settings_env import (
    ASSIGNMENT,
    COMPOSE_SECTION_MARKER,
    PROCESS_VARIABLES,
    PROXY_BYPASS,
    EnvExample,
    all_setting_variables,
    container_variables,
    parse_env_example,
    sdk_variables,
    settings_env_names,
)
from tests.deploy_checks.variables import (
    NOT_PASSED,
    variable_problems,
)
from tests.deploy_checks.wiring import (
    called_hosts,
    chatqna_services,
    deploy_config_urls,
    override_problems,
    proxy_problems,
    role_port,
    scrape_coverage_problems,
    service_hosts,
    target_ports,
    url_problems,
    wiring_problems,
)

__all__ = [
    "ASSIGNMENT",
    "BRACED",
    "COMPOSE_FILE",
    "COMPOSE_SECTION_MARKER",
    "ENV_EXAMPLE",
    "INTERPOLATION",
    "NOT_PASSED",
    "OVERRIDE_FILES",
    "PROCESS_VARIABLES",
    "PROXY_BYPASS",
    "REPO",
    "SCHEMA_FILE",
    "SCHEMA_PACKAGE",
    "SCHEMA_SHA256",
    "SCRAPE_CONFIG",
    "EnvExample",
    "Instruction",
    "Problem",
    "Reference",
    "all_setting_variables",
    "called_hosts",
    "chatqna_services",
    "compose_schema",
    "compose_schema_text",
    "container_environment",
    "container_variables",
    "deploy_config_urls",
    "dockerfile_problems",
    "dockerignore_patterns",
    "environment_entries",
    "interpolate",
    "interpolate_doc",
    "is_ignored",
    "load_yaml",
    "merge",
    "override_problems",
    "package_data_problems",
    "parse_dockerfile",
    "parse_env_example",
    "proxy_problems",
    "references",
    "repository_problems",
    "role_port",
    "schema_problems",
    "scrape_coverage_problems",
    "sdk_variables",
    "service_hosts",
    "settings_env_names",
    "target_ports",
    "url_problems",
    "variable_problems",
    "wiring_problems",
]
