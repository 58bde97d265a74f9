"""Settings: defaults, environment names, validation messages that name the variable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chatqna.settings import (
    ClientSettings,
    Settings,
    describe_validation_error,
    dirty_results_allowed,
    variables_set,
)


def _error_for(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    return describe_validation_error(caught.value)


def test_defaults_are_the_embedded_service(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.mega_service_port == 8888
    assert settings.tei_embedding_endpoint is None and settings.llm_endpoint is None
    assert settings.retriever_hybrid_retrieval_enabled is True
    assert settings.multi_turn_mode == "blend"
    assert settings.multi_turn_blend_enabled is False
    assert settings.multi_turn_blend_alpha == 0.7
    assert settings.multi_turn_history_turns == 2
    assert settings.multi_turn_history_roles == "user_assistant"
    assert settings.multi_turn_bm25_history_weight == 0.3
    assert settings.multi_turn_rerank_query == "conversation"
    assert settings.chatqna_embedded_reranker == "none"
    assert settings.rerank_enabled is True
    assert settings.startup_warnings() == []


def test_reads_the_seed_variable_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEI_EMBEDDING_ENDPOINT", "http://tei:80/")
    monkeypatch.setenv("LLM_ENDPOINT", "http://vllm:80/v1")
    monkeypatch.setenv("LLM_MODEL_ID", "some/model")
    monkeypatch.setenv("MEGA_SERVICE_PORT", "9000")
    monkeypatch.setenv("RETRIEVER_HYBRID_RETRIEVAL_ENABLED", "false")
    monkeypatch.setenv("MULTI_TURN_MODE", "condense")
    monkeypatch.setenv("MULTI_TURN_BLEND_ALPHA", "0.5")
    monkeypatch.setenv("MULTI_TURN_HISTORY_TURNS", "4")
    settings = Settings()
    assert settings.tei_embedding_endpoint == "http://tei:80"
    assert settings.llm_endpoint == "http://vllm:80/v1"
    assert settings.mega_service_port == 9000
    assert settings.retriever_hybrid_retrieval_enabled is False
    assert settings.multi_turn_mode == "condense"
    assert settings.multi_turn_blend_alpha == 0.5
    assert settings.multi_turn_history_turns == 4


def test_empty_endpoint_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEI_EMBEDDING_ENDPOINT", "")
    monkeypatch.setenv("REDIS_URL", " ")
    settings = Settings()
    assert settings.tei_embedding_endpoint is None and settings.redis_url is None


@pytest.mark.parametrize(
    "name",
    [
        "CHATQNA_API_KEY",
        "OPENAI_API_KEY",
        "CHATQNA_LLM_GGUF",
        "CHATQNA_LLM_THREADS",
        "CONDENSE_LLM_MODEL_ID",
    ],
)
def test_blank_optional_value_means_unset(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # `.env.example` and compose pass these as empty strings; none may become a value.
    monkeypatch.setenv(name, "")
    assert getattr(Settings(), name.lower()) is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MULTI_TURN_MODE": "rewrite"}, "MULTI_TURN_MODE"),
        ({"MULTI_TURN_BLEND_ALPHA": "1.5"}, "MULTI_TURN_BLEND_ALPHA"),
        ({"MULTI_TURN_BLEND_ALPHA": "-0.1"}, "MULTI_TURN_BLEND_ALPHA"),
        ({"MULTI_TURN_HISTORY_TURNS": "-1"}, "MULTI_TURN_HISTORY_TURNS"),
        ({"MULTI_TURN_HISTORY_TURNS": "40"}, "MULTI_TURN_HISTORY_TURNS"),
        ({"MEGA_SERVICE_PORT": "70000"}, "MEGA_SERVICE_PORT"),
        ({"TEI_EMBEDDING_ENDPOINT": "tei:80"}, "TEI_EMBEDDING_ENDPOINT"),
        ({"LLM_ENDPOINT": "http://vllm"}, "LLM_MODEL_ID"),
        ({"RETRIEVER_HYBRID_RETRIEVAL_ENABLED": "perhaps"}, "RETRIEVER_HYBRID_RETRIEVAL_ENABLED"),
        ({"CHUNK_SIZE": "500", "CHUNK_OVERLAP": "500"}, "CHUNK_OVERLAP"),
    ],
)
def test_bad_values_fail_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    assert named in _error_for(monkeypatch, **env)


def test_history_turns_must_fit_the_embedding_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _error_for(monkeypatch, MULTI_TURN_HISTORY_TURNS="8", TEI_EMBEDDING_MAX_BATCH="9")
    assert "a batch of 10 embedding inputs" in message
    assert "TEI_EMBEDDING_MAX_BATCH=9" in message
    monkeypatch.setenv("TEI_EMBEDDING_MAX_BATCH", "10")
    assert Settings().multi_turn_history_turns == 8
    # Without the self-contained check the previous question is not embedded.
    monkeypatch.setenv("TEI_EMBEDDING_MAX_BATCH", "9")
    monkeypatch.setenv("MULTI_TURN_SELF_CONTAINED_SIMILARITY", "0")
    assert Settings().multi_turn_history_turns == 8


def test_startup_warnings() -> None:
    both = Settings(multi_turn_mode="condense", multi_turn_blend_enabled=True)
    assert any("condense wins" in w for w in both.startup_warnings())
    assert both.blend_active is False
    zero = Settings(multi_turn_blend_enabled=True, multi_turn_blend_alpha=0.0)
    assert any("MULTI_TURN_BLEND_ALPHA=0" in w for w in zero.startup_warnings())
    assert Settings(multi_turn_blend_alpha=0.0).startup_warnings() == []


def test_packaged_gguf_is_found_or_explained(tmp_path: object) -> None:
    settings = Settings()
    path = settings.embedded_gguf()
    assert path.suffix == ".gguf" and path.is_file()
    custom = Settings(chatqna_llm_gguf="/models/other.gguf")
    assert str(custom.embedded_gguf()) == "/models/other.gguf"


def test_workers_default_to_one_and_auto_is_one_per_core() -> None:
    assert Settings().worker_count(cores=8) == 1
    # The embedded index is shared through its data directory, as Redis is.
    assert Settings(chatqna_workers="auto").worker_count(cores=8) == 8
    assert Settings(chatqna_workers="auto").worker_count(cores=0) == 1
    remote = Settings(chatqna_workers="auto", retriever_endpoint="http://retriever:7000")
    assert remote.worker_count(cores=8) == 8
    assert Settings(chatqna_workers=3).worker_count(cores=8) == 3


@pytest.mark.parametrize(
    ("value", "shown"), [("0", "0"), ("-2", "-2"), ("foo", "'foo'"), ("1.5", "'1.5'")]
)
def test_workers_must_be_a_positive_count_or_auto(
    monkeypatch: pytest.MonkeyPatch, value: str, shown: str
) -> None:
    message = _error_for(monkeypatch, CHATQNA_WORKERS=value)
    assert message.splitlines() == [
        "invalid configuration:",
        f"  CHATQNA_WORKERS: must be a positive integer or auto, got {shown}",
    ]


def test_workers_accept_a_count_auto_or_blank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATQNA_WORKERS", " AUTO ")
    assert Settings().chatqna_workers == "auto"
    monkeypatch.setenv("CHATQNA_WORKERS", "2")
    assert Settings().chatqna_workers == 2
    monkeypatch.setenv("CHATQNA_WORKERS", "")
    assert Settings().chatqna_workers == 1


def test_the_traces_exporter_list_is_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp, Console")
    assert Settings().otel_traces_exporter == ["otlp", "console"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert Settings().otel_traces_exporter == []
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "")
    assert Settings().otel_traces_exporter is None


def test_an_exporter_name_nothing_installed_registers_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,jaeger")
    message = _error_for(monkeypatch)
    line = message.splitlines()[1].strip()
    assert line.startswith("OTEL_TRACES_EXPORTER: no span exporter named 'jaeger' is installed")
    assert "(installed: console, otlp, otlp_proto_grpc, otlp_proto_http" in line
    assert len(message.splitlines()) == 2


def test_propagators_are_read_as_opentelemetry_api_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_PROPAGATORS", " tracecontext ,baggage")
    assert Settings().otel_propagators == ["tracecontext", "baggage"]
    monkeypatch.setenv("OTEL_PROPAGATORS", "None,b3")  # nothing after none is loaded
    assert Settings().otel_propagators == ["None", "b3"]
    monkeypatch.setenv("OTEL_PROPAGATORS", "")  # the API's default
    assert Settings().otel_propagators is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "tracecontext,b3",
            "OTEL_PROPAGATORS: no propagator named 'b3' is installed (installed: baggage, "
            "tracecontext); install opentelemetry-propagator-b3 for it, or name another",
        ),
        ("jaeger", "install opentelemetry-propagator-jaeger for it"),
        ("TraceContext", "install the package that registers it (opentelemetry_propagator)"),
        ("tracecontext,baggage,", "OTEL_PROPAGATORS: has an empty name"),
    ],
)
def test_a_propagator_name_nothing_installed_registers_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    """opentelemetry-api raises on each of these when `opentelemetry.propagate` is imported."""
    message = _error_for(monkeypatch, OTEL_PROPAGATORS=value)
    assert expected in message.splitlines()[1]
    assert len(message.splitlines()) == 2


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "victoriatraces:10428"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318/v1/traces",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp_proto_grpc,otlp_proto_http",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
            },
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://victoriatraces:10428"}, None),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector/v1/traces"}, None),
        # gRPC takes what its client does: a scheme-less host:port too.
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            None,
        ),
    ],
)
def test_an_otlp_http_endpoint_must_be_an_http_url(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], refused: str | None
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if refused is None:
        Settings()
        return
    message = _error_for(monkeypatch)
    assert f"{refused} must be an http:// or https:// URL" in message
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in message


@pytest.mark.parametrize(
    "env",
    [
        {
            "OTEL_TRACES_EXPORTER": "otlp_proto_grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
        },
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"},
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"},
    ],
)
def test_an_endpoint_no_otlp_http_exporter_uses_is_not_checked(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    Settings()


def test_client_settings_read_the_api_key_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "victoriatraces:4317")
    monkeypatch.setenv("CHATQNA_API_KEY", " ")
    assert ClientSettings().chatqna_api_key is None
    assert set(ClientSettings.model_fields) == {"chatqna_api_key"}
    monkeypatch.setenv("CHATQNA_API_KEY", "key\r\nX-Injected: yes")
    with pytest.raises(ValidationError) as caught:
        ClientSettings()
    assert "CHATQNA_API_KEY: contains a line break" in describe_validation_error(caught.value)


def test_an_unsupported_otlp_protocol_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ValidationError) as failure:
        Settings()
    message = describe_validation_error(failure.value)
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" in message
    assert "http/protobuf" in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OPENAI_API_KEY", "sk-secret\n"),
        ("CHATQNA_API_KEY", "key\r\nX-Injected: yes"),
        ("LLM_ENDPOINT", "http://vllm:8000\r\nX-Injected: yes"),
    ],
)
def test_a_line_break_in_a_header_or_url_value_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    message = _error_for(monkeypatch, LLM_MODEL_ID="m", **{name: value})
    assert f"{name}: " in message and "line break" in message
    assert "secret" not in message and "Injected" not in message


def test_a_bad_endpoint_url_is_named_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = _error_for(monkeypatch, TEI_EMBEDDING_ENDPOINT="ftp://user:hunter2@tei:80")
    assert "TEI_EMBEDDING_ENDPOINT" in message and "ftp://tei:80" in message
    assert "hunter2" not in message


def test_one_line_per_variable_names_only_the_variable() -> None:
    # Each member of a union adds an error whose location goes on past the variable.
    with pytest.raises(ValidationError) as caught:
        Settings(chatqna_workers=1.5, rrf_k=0)
    assert len(caught.value.errors()) == 3
    lines = describe_validation_error(caught.value).splitlines()[1:]
    assert [line.split(": ")[0].strip() for line in lines] == ["CHATQNA_WORKERS", "RRF_K"]
    assert "Input should be 'auto'" in lines[0]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("garbage", "must be a redis://, rediss:// or unix:// URL, got 'garbage'"),
        ("http://user:hunter2@redis:6379", "got 'http://redis:6379'"),
        ("redis://redis:abc", "has an invalid port: 'redis://redis:abc'"),
    ],
)
def test_a_bad_redis_url_is_named_without_its_password(
    monkeypatch: pytest.MonkeyPatch, value: str, shown: str
) -> None:
    message = _error_for(monkeypatch, REDIS_URL=value)
    assert message.startswith("invalid configuration:\n  REDIS_URL: ") and shown in message
    assert "hunter2" not in message


@pytest.mark.parametrize(
    "value", ["redis://redis:6379", "rediss://user:pw@redis:6380/0", "unix:///run/redis.sock"]
)
def test_redis_urls_of_every_scheme_are_accepted(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("REDIS_URL", value)
    assert Settings().redis_url == value


@pytest.mark.parametrize(
    ("value", "disabled"),
    [
        ("true", True),
        ("TRUE", True),
        (" True ", True),
        ("1", False),
        ("yes", False),
        ("false", False),
    ],
)
def test_otel_sdk_disabled_is_the_specification_s_boolean(
    monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    assert Settings().otel_sdk_disabled is disabled


@pytest.mark.parametrize("value", ["chat", "chat/", "/chat/", "/a//b", "/a b"])
def test_a_root_path_must_be_a_path_without_a_trailing_slash(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    assert _error_for(monkeypatch, CHATQNA_ROOT_PATH=value).splitlines()[1].strip() == (
        "CHATQNA_ROOT_PATH: must start with / and not end with /, e.g. /chatqna "
        f"(no spaces, no //), got {value!r}"
    )


@pytest.mark.parametrize("value", ["debug", "Info", " warning "])
def test_the_log_level_is_read_in_any_case(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CHATQNA_LOG_LEVEL", value)
    assert Settings().chatqna_log_level == value.strip().upper()


def test_a_root_path_is_kept_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATQNA_ROOT_PATH", "/chat")
    assert Settings().chatqna_root_path == "/chat"


def test_max_tokens_limit_defaults_to_2048_and_may_equal_the_default_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().llm_max_tokens_limit == 2048
    monkeypatch.setenv("LLM_MAX_TOKENS", "1024")
    monkeypatch.setenv("LLM_MAX_TOKENS_LIMIT", "1024")
    assert (Settings().llm_max_tokens, Settings().llm_max_tokens_limit) == (1024, 1024)


def test_max_tokens_limit_below_the_default_length_stops_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = _error_for(monkeypatch, LLM_MAX_TOKENS_LIMIT="256")
    assert message.splitlines() == [
        "invalid configuration:",
        "  configuration: LLM_MAX_TOKENS=512 is above LLM_MAX_TOKENS_LIMIT=256: the default "
        "answer length must be one a request may ask for",
    ]


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_max_tokens_limit_must_be_a_positive_count(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    assert "LLM_MAX_TOKENS_LIMIT: " in _error_for(monkeypatch, LLM_MAX_TOKENS_LIMIT=value)


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", ["localhost", "127.0.0.1", "[::1]"]),
        ("localhost", ["localhost", "127.0.0.1", "[::1]"]),
        ("::1", ["localhost", "127.0.0.1", "[::1]"]),
        ("127.0.0.2", ["localhost", "127.0.0.1", "[::1]", "127.0.0.2"]),
        ("0.0.0.0", ["*"]),
        ("::", ["*"]),
        ("10.1.2.3", ["*"]),
        ("chatqna.internal", ["*"]),
    ],
)
def test_the_allowed_hosts_default_to_the_loopback_names_on_a_loopback_address(
    host: str, allowed: list[str]
) -> None:
    assert Settings(chatqna_host=host).allowed_hosts() == allowed


def test_allowed_hosts_are_one_comma_separated_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    given = "chat.example.com, *.Internal.example, ::1,10.0.0.5 ,"
    monkeypatch.setenv("CHATQNA_ALLOWED_HOSTS", given)
    # An IPv6 address as `Host` brackets it; the loopback names stay, for the machine's own
    # checks (`chatqna ask`, a container's healthcheck).
    expected = ["chat.example.com", "*.internal.example", "[::1]", "10.0.0.5", "localhost"]
    assert Settings().allowed_hosts() == [*expected, "127.0.0.1"]
    monkeypatch.setenv("CHATQNA_HOST", "0.0.0.0")
    monkeypatch.setenv("CHATQNA_ALLOWED_HOSTS", "[::1]")
    assert Settings().allowed_hosts() == ["[::1]", "localhost", "127.0.0.1"]


@pytest.mark.parametrize("entry", ["chat.*.example", "a b", "*.10.0.0.5", "http://chat.example"])
def test_an_allowed_host_that_matches_nothing_is_refused(
    monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    monkeypatch.setenv("CHATQNA_ALLOWED_HOSTS", entry)
    with pytest.raises(ValidationError, match="chatqna_allowed_hosts"):
        Settings()


def test_the_variables_set_are_those_settings_reads_as_they_were_written() -> None:
    environ = {"MULTI_TURN_BLEND_ENABLED": "true", "rrf_k": "30", "HOME": "/home/someone"}
    assert variables_set(environ) == {"MULTI_TURN_BLEND_ENABLED": "true", "rrf_k": "30"}


@pytest.mark.parametrize(
    ("value", "allowed"), [("1", True), ("true", True), ("0", False), ("", False), (None, False)]
)
def test_results_of_uncommitted_code_are_allowed_only_when_asked(
    value: str | None, allowed: bool
) -> None:
    environ = {} if value is None else {"CHATQNA_BENCH_ALLOW_DIRTY": value}
    assert dirty_results_allowed(environ) is allowed
