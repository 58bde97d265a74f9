"""What a span costs, apart from any server: OpenTelemetry's SDK against the service's recorder.

    .venv/bin/python tests/rag-benchmarks/span_cost.py [--turns 2000] [--rounds 3]

Records `--turns` turns shaped like a chat turn (a server span with the stable HTTP
attributes and nine children, the pipeline stages and three client spans, with a few
attributes each) twice per round, the two recorders alternating: the SDK's `TracerProvider`
as the service used it (a resource, the default sampler, a processor that only keeps the
spans), and the service's `ServiceTracerProvider` (`chatqna.telemetry.spans`), whose
exporter keeps only each span's encoded bytes, so a span is freed as it ends. Then each
encodes as OTLP protobuf in batches of 512: the SDK's exporter
(`encode_spans(...).SerializeToString()`) the kept spans, the service's `SpanEncoder` each
span (as it does when a span ends) and one request per batch. Prints the CPU time
(`time.process_time`) per span and per turn for each part, medians of `--rounds`, and
writes `results/span_cost.json`. What a server adds on top (the export's HTTP requests,
garbage collection, the export thread) is in `tracing_overhead.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from chatqna.telemetry.otlp_encoding import SpanEncoder
from chatqna.telemetry.spans import InMemorySpans, RecordedSpan, ServiceTracerProvider

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "span_cost.json"
CHILDREN = (
    "chatqna.orchestrate",
    "chatqna.embed",
    "POST",
    "chatqna.retrieve",
    "chatqna.rerank",
    "POST",
    "chatqna.reranker_selection",
    "chatqna.generate",
    "POST",
)
SPANS_PER_TURN = 1 + len(CHILDREN)
BATCH = 512
SERVER_ATTRIBUTES = {
    "http.request.method": "POST",
    "http.route": "/v1/chatqna",
    "url.scheme": "http",
    "url.path": "/v1/chatqna",
    "server.address": "127.0.0.1",
    "server.port": 8888,
    "client.address": "127.0.0.1",
    "network.protocol.version": "1.1",
    "http.response.status_code": 200,
}


class Keeper(SpanExporter):
    """Keeps every finished span (what a batch processor hands its exporter)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def record(tracer: trace.Tracer, turns: int) -> float:
    """CPU seconds per turn to start, fill and end a turn's spans."""
    started = time.process_time()
    for _ in range(turns):
        with tracer.start_as_current_span("POST /v1/chatqna", kind=trace.SpanKind.SERVER) as top:
            top.set_attributes(SERVER_ATTRIBUTES)
            for name in CHILDREN:
                with tracer.start_as_current_span(name) as child:
                    child.set_attribute("chatqna.k", 4)
                    child.set_attribute("chatqna.mode", "blend")
                    child.set_attribute("chatqna.elapsed_ms", 1.25)
    return (time.process_time() - started) / turns


def encode(spans: Sequence[ReadableSpan]) -> float:
    """CPU seconds per span to encode `spans` as the SDK's OTLP exporter does."""
    started = time.process_time()
    for start in range(0, len(spans), BATCH):
        encode_spans(spans[start : start + BATCH]).SerializeToString()
    return (time.process_time() - started) / len(spans)


def encode_ours(spans: Sequence[RecordedSpan]) -> float:
    """CPU seconds per span to encode `spans` as the service does: each span as it ends,
    then one request per batch from the encoded spans."""
    encoder = SpanEncoder({"service.name": "chatqna"})
    started = time.process_time()
    encoded = [encoder.scope_spans(span) for span in spans]
    for start in range(0, len(encoded), BATCH):
        encoder.request_of(encoded[start : start + BATCH])
    return (time.process_time() - started) / len(spans)


def sdk_round(turns: int) -> dict[str, float]:
    keeper = Keeper()
    provider = TracerProvider(resource=Resource.create({"service.name": "chatqna"}))
    provider.add_span_processor(SimpleSpanProcessor(keeper))
    tracer = provider.get_tracer("chatqna")
    record(tracer, 100)  # warm-up
    keeper.spans.clear()
    per_turn = record(tracer, turns)
    per_span_encoded = encode(keeper.spans)
    provider.shutdown()
    return figures(per_turn, per_span_encoded)


def service_round(turns: int) -> dict[str, float]:
    # Recording: the service's exporter keeps only the encoded bytes, so the span is freed
    # as it ends; encoding is measured apart, on spans kept for it.
    resource = Resource.create({"service.name": "chatqna"})
    tracer = ServiceTracerProvider(lambda span: None, resource=resource).get_tracer("chatqna")
    record(tracer, 100)  # warm-up
    per_turn = record(tracer, turns)
    keeper = InMemorySpans()
    record(ServiceTracerProvider(keeper, resource=resource).get_tracer("chatqna"), turns)
    per_span_encoded = encode_ours(list(keeper.get_finished_spans()))
    return figures(per_turn, per_span_encoded)


def figures(per_turn: float, per_span_encoded: float) -> dict[str, float]:
    return {
        "record_us_per_span": per_turn / SPANS_PER_TURN * 1e6,
        "record_us_per_turn": per_turn * 1e6,
        "encode_us_per_span": per_span_encoded * 1e6,
        "encode_us_per_turn": per_span_encoded * SPANS_PER_TURN * 1e6,
    }


def summarize(rounds: list[dict[str, float]]) -> dict[str, float]:
    summary = {key: round(statistics.median(r[key] for r in rounds), 1) for key in rounds[0]}
    summary["total_us_per_turn"] = round(
        summary["record_us_per_turn"] + summary["encode_us_per_turn"], 1
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    rounds: dict[str, list[dict[str, float]]] = {"sdk": [], "service": []}
    for _ in range(args.rounds):
        rounds["sdk"].append(sdk_round(args.turns))
        rounds["service"].append(service_round(args.turns))
    summary = {name: summarize(r) for name, r in rounds.items()}
    sdk, ours = summary["sdk"], summary["service"]
    print(f"{SPANS_PER_TURN} spans a turn, medians of {args.rounds} rounds, µs of CPU:")
    print("| part | SDK per span | service per span | SDK per turn | service per turn |")
    print("|---|---|---|---|---|")
    for label, key in (("start, fill and end", "record"), ("OTLP protobuf encoding", "encode")):
        print(
            f"| {label} | {sdk[key + '_us_per_span']:.1f} | {ours[key + '_us_per_span']:.1f} "
            f"| {sdk[key + '_us_per_turn']:.0f} | {ours[key + '_us_per_turn']:.0f} |"
        )
    print(f"| together | | | {sdk['total_us_per_turn']:.0f} | {ours['total_us_per_turn']:.0f} |")
    report = {
        "benchmark": "span_cost",
        "command": "tests/rag-benchmarks/span_cost.py " + " ".join(argv or sys.argv[1:]),
        "turns": args.turns,
        "spans_per_turn": SPANS_PER_TURN,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "summary": summary,
        "rounds": rounds,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
