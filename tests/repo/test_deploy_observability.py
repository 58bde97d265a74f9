"""The deploy-side observability files agree with the service.

They cover the Grafana dashboard, the datasource and dashboard provisioning, the scrape
config and the VictoriaTraces notes. Every metric, label value, span name and attribute key
the dashboard uses must be one the service emits, and every datasource a panel names must be
provisioned. No network is used; the YAML files are read with PyYAML (the test extra).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from chatqna.settings import Settings
from chatqna.telemetry import names
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.tracing import DEFAULT_SERVICE_NAME, build_exporter

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "rag-pipeline.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
SCRAPE = DEPLOY / "prometheus" / "prometheus.yml"
TRACES_README = DEPLOY / "victoriatraces" / "README.md"
PIPELINE = ROOT / "chatqna" / "pipeline"

DOCUMENTED_STAGES = {"condense", "embed", "retrieve", "rerank", "first_token", "generate", "total"}
CONDENSE_STATUSES = {"ok", "failed", "skipped_no_history"}
BLEND_EXECUTED = {"true", "false"}  # chat.py writes str(bool).lower()
OTLP_TRACES_PATH = "/insert/opentelemetry/v1/traces"

METRIC = re.compile(r"\bchatqna_[a-z0-9_]+\b")
SELECTOR = re.compile(r"\b(chatqna_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


# --- helpers -----------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def _targets(dashboard: dict[str, Any], uid: str) -> list[dict[str, Any]]:
    """Targets that query the datasource `uid` (their own ref, or their panel's)."""
    chosen = []
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            ref = target.get("datasource") or panel.get("datasource") or {}
            if ref.get("uid") == uid:
                chosen.append(target)
    return chosen


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in _targets(dashboard, "chatqna-metrics")]


def _flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _load_items(path: Path, list_key: str) -> list[dict[str, Any]]:
    """Items of the top-level list `list_key`, nested mappings flattened to dotted keys."""
    return [_flatten(item) for item in yaml.safe_load(path.read_text(encoding="utf-8"))[list_key]]


def _datasources() -> dict[str, dict[str, Any]]:
    return {item["uid"]: item for item in _load_items(DATASOURCES, "datasources")}


def _series_names() -> dict[str, set[str]]:
    """Exposed series name -> label names, from the service's own registry."""
    metrics = ServiceMetrics()
    labels = {
        family: set(collector._labelnames)
        for family, collector in (
            ("chatqna_requests", metrics.requests),
            ("chatqna_stage_seconds", metrics.stage_seconds),
            ("chatqna_condense", metrics.condense),
            ("chatqna_blend", metrics.blend),
            ("chatqna_upstream_errors", metrics.upstream_errors),
            ("chatqna_requests_in_flight", metrics.in_flight),
        )
    }
    series: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        # The family of a Counter is named without `_total`; its samples carry it.
        suffixes = {
            "counter": ["_total"],
            "gauge": [""],
            "histogram": ["_bucket", "_sum", "_count"],
        }
        for suffix in suffixes[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            series[family.name + suffix] = labels[family.name] | extra
    return series


def _matchers(exprs: list[str]) -> list[tuple[str, str, str, str]]:
    """(metric, label, operator, value) for every label matcher in the expressions."""
    found = []
    for expr in exprs:
        for metric, body in SELECTOR.findall(expr):
            for label, operator, value in MATCHER.findall(body):
                found.append((metric, label, operator, value))
    return found


def _literal_values(operator: str, value: str) -> set[str] | None:
    """The label values a matcher names, or None when it is a variable or a real regex."""
    if "$" in value:
        return None
    if operator in ("=", "!="):
        return {value}
    if re.fullmatch(r"[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*", value):
        return set(value.split("|"))
    return None


def _trace_id_links(panel: dict[str, Any]) -> list[dict[str, Any]]:
    links = []
    for override in panel["fieldConfig"]["overrides"]:
        pattern = override["matcher"]["options"]
        if re.search(pattern, "traceID") or re.search(pattern, "Trace ID"):
            for prop in override["properties"]:
                if prop["id"] == "links":
                    links.extend(prop["value"])
    return links


def _readme_value(variable: str) -> str:
    match = re.search(rf"^{variable}=(\S+)$", TRACES_README.read_text(encoding="utf-8"), re.M)
    assert match, f"{variable} is not given in {TRACES_README.name}"
    return match.group(1)


def _span_names() -> set[str]:
    return {value for key, value in vars(names).items() if key.startswith("SPAN_")}


def _attribute_keys() -> set[str]:
    return {
        value
        for key, value in vars(names).items()
        if key.isupper() and not key.startswith(("SPAN_", "EVENT_")) and isinstance(value, str)
    }


# --- the dashboard -----------------------------------------------------------------------


def test_dashboard_is_valid_json_with_its_identity() -> None:
    dashboard = _dashboard()
    assert dashboard["title"] == "RAG pipeline"
    assert dashboard["uid"] == "rag-pipeline"
    assert dashboard["schemaVersion"] == 39


def test_panels_have_ids_refids_and_fit_the_grid_without_overlap() -> None:
    panels = _panels(_dashboard())
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    boxes = []
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["y"] >= 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        boxes.append((panel["title"], grid))
        if panel["type"] != "row":
            refs = [target["refId"] for target in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), panel["title"]
    for index, (title, a) in enumerate(boxes):
        for other, b in boxes[index + 1 :]:
            apart = (
                a["x"] + a["w"] <= b["x"]
                or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"]
                or b["y"] + b["h"] <= a["y"]
            )
            assert apart, f"{title!r} overlaps {other!r}"


def test_every_metric_in_the_dashboard_is_exposed_by_the_service() -> None:
    exposed = _series_names()
    used = {name for expr in _exprs(_dashboard()) for name in METRIC.findall(expr)}
    assert used, "the dashboard queries no chatqna metric"
    assert used <= set(exposed), sorted(used - set(exposed))
    # and every metric family the service exposes is on the dashboard
    families = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    assert families == {family.name for family in ServiceMetrics().registry.collect()}


def test_the_dashboard_uses_only_labels_the_metrics_have() -> None:
    exposed = _series_names()
    exprs = _exprs(_dashboard())
    # `job` is the scrape job's own label: the dashboard reads the megaservice's job only,
    # so the retriever service's metrics (the same names) do not mix into its panels.
    jobs = {job["job_name"] for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    for expr in exprs:
        selected = [metric for metric, label, _, _ in _matchers([expr]) if label == "job"]
        assert sorted(selected) == sorted(METRIC.findall(expr)), expr
    for metric, label, operator, value in _matchers(exprs):
        if label == "job":
            assert (operator, value) == ("=", "chatqna") and value in jobs, (metric, value)
            continue
        assert label in exposed[metric], (metric, label)
    every_label = set().union(*exposed.values())
    for expr in exprs:
        for group in GROUPING.findall(expr):
            for label in filter(None, (part.strip() for part in group.split(","))):
                assert label in every_label, (expr, label)


def test_documented_stages_are_the_stages_the_pipeline_records() -> None:
    source = "\n".join(path.read_text(encoding="utf-8") for path in PIPELINE.glob("*.py"))
    recorded = set(re.findall(r'clock\.record\("([a-z_]+)"', source))
    recorded |= set(re.findall(r'stages\["([a-z_]+)"\]', source))
    assert recorded == DOCUMENTED_STAGES


def test_stage_labels_on_the_dashboard_are_documented_stages() -> None:
    dashboard = _dashboard()
    named = set()
    for metric, label, operator, value in _matchers(_exprs(dashboard)):
        if metric.startswith("chatqna_stage_seconds") and label == "stage":
            values = _literal_values(operator, value)
            if values is not None:
                named |= values
    assert named, "no panel names a stage"
    assert named <= DOCUMENTED_STAGES, sorted(named - DOCUMENTED_STAGES)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    options = {option["value"] for option in variables["stage"]["options"]}
    assert options == DOCUMENTED_STAGES
    assert set(variables["stage"]["query"].split(",")) == DOCUMENTED_STAGES


def test_condense_and_blend_label_values_are_ones_the_service_writes() -> None:
    allowed = {
        ("chatqna_condense_total", "status"): CONDENSE_STATUSES,
        ("chatqna_blend_total", "executed"): BLEND_EXECUTED,
    }
    seen = set()
    for metric, label, operator, value in _matchers(_exprs(_dashboard())):
        if (metric, label) in allowed:
            values = _literal_values(operator, value)
            assert values is not None and values <= allowed[(metric, label)], (metric, value)
            seen.add((metric, label))
    assert seen == set(allowed)


# --- datasources -------------------------------------------------------------------------


def test_panel_datasources_are_provisioned() -> None:
    provisioned = _datasources()
    refs = []
    for panel in _panels(_dashboard()):
        if "datasource" in panel:
            refs.append(panel["datasource"])
        refs.extend(t["datasource"] for t in panel.get("targets", []) if "datasource" in t)
    assert refs
    for ref in refs:
        assert ref["uid"] in provisioned, ref
        assert ref["type"] == provisioned[ref["uid"]]["type"], ref


def test_provisioned_datasources_point_at_victoriatraces_and_victoriametrics() -> None:
    provisioned = _datasources()
    traces = provisioned["victoriatraces"]
    assert traces["name"] == "VictoriaTraces"
    assert traces["type"] == "jaeger"
    assert urlsplit(traces["url"]).path.rstrip("/").endswith("/select/jaeger")
    assert urlsplit(traces["url"]).port == 10428
    metrics = provisioned["chatqna-metrics"]
    assert metrics["name"] == "Metrics"
    assert metrics["type"] == "prometheus"
    assert metrics["url"] == "http://victoriametrics:8428"


def test_dashboard_provider_loads_the_dashboards_directory() -> None:
    (provider,) = _load_items(PROVIDERS, "providers")
    assert provider["type"] == "file"
    assert provider["options.path"] == "/var/lib/grafana/dashboards"


def test_the_scrape_config_has_scrape_configs() -> None:
    assert yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))["scrape_configs"]


# --- traces ------------------------------------------------------------------------------


def test_trace_searches_use_the_service_name_and_real_span_names_and_attributes() -> None:
    searches = [t for t in _targets(_dashboard(), "victoriatraces") if t.get("queryType")]
    assert searches
    for target in searches:
        assert target["queryType"] == "search"
        assert target["service"] == DEFAULT_SERVICE_NAME == "chatqna"
        if "operation" in target:
            assert target["operation"] in _span_names()
        for pair in target.get("tags", "").split():
            key, _, value = pair.partition("=")
            assert key in _attribute_keys(), key
            if key == names.CONDENSE_STATUS:
                assert value in CONDENSE_STATUSES


def test_trace_tables_link_each_trace_id_to_its_waterfall() -> None:
    tables = [
        panel
        for panel in _panels(_dashboard())
        if panel["type"] == "table" and panel["datasource"]["uid"] == "victoriatraces"
    ]
    assert tables
    for table in tables:
        links = _trace_id_links(table)
        explore = [link["url"] for link in links if link["url"].startswith("/explore?")]
        assert explore, table["title"]
        query = parse_qs(urlsplit(explore[0]).query)
        assert query["schemaVersion"] == ["1"]
        (pane,) = json.loads(unquote(query["panes"][0])).values()
        assert pane["datasource"] == "victoriatraces"
        (trace_query,) = pane["queries"]
        assert trace_query["datasource"] == {"type": "jaeger", "uid": "victoriatraces"}
        assert trace_query["query"] == "${__value.raw}"
        assert "queryType" not in trace_query  # no query type = look a trace up by its ID
        here = [link["url"] for link in links if link["url"].startswith("/d/rag-pipeline/")]
        assert here and "var-trace_id=${__value.raw}" in here[0]


def test_trace_id_box_drives_a_waterfall_panel() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["trace_id"]["type"] == "textbox"
    (waterfall,) = [panel for panel in _panels(dashboard) if panel["type"] == "traces"]
    assert waterfall["datasource"]["uid"] == "victoriatraces"
    (target,) = waterfall["targets"]
    assert target["query"] == "$trace_id"
    assert "queryType" not in target


# --- scrape config and VictoriaTraces notes ----------------------------------------------


def test_scrape_config_targets_the_service_metrics_endpoint() -> None:
    text = SCRAPE.read_text(encoding="utf-8")
    assert re.search(r"^scrape_configs:$", text, re.M)
    assert re.search(r"^\s+metrics_path:\s*/metrics$", text, re.M)
    port = Settings().mega_service_port
    assert re.search(rf"^\s+-\s*[\"']?chatqna-backend:{port}[\"']?$", text, re.M)
    port = Settings().retriever_service_port
    assert re.search(rf"^\s+-\s*[\"']?retriever:{port}[\"']?$", text, re.M)


def test_readme_endpoints_resolve_to_the_victoriatraces_otlp_path() -> None:
    base = _readme_value("OTEL_EXPORTER_OTLP_ENDPOINT")
    full = _readme_value("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    assert urlsplit(full).path == OTLP_TRACES_PATH
    assert urlsplit(full).port == 10428
    for settings in (
        Settings(otel_exporter_otlp_endpoint=base),
        Settings(otel_exporter_otlp_traces_endpoint=full),
    ):
        exporter = build_exporter("otlp_proto_http", settings)
        assert exporter._endpoint == full  # type: ignore[attr-defined]
        exporter.shutdown()


def test_readme_names_the_retention_flag() -> None:
    assert "-retentionPeriod" in TRACES_README.read_text(encoding="utf-8")
