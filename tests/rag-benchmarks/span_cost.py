"""What the OpenTelemetry SDK costs per span, apart from any server: a floor for tracing.

    .venv/bin/python tests/rag-benchmarks/span_cost.py [--turns 2000] [--rounds 3]

Builds the SDK's `TracerProvider` as the service does (a resource, the default sampler)
and records `--turns` turns shaped like a chat turn: a server span with the stable HTTP
attributes and nine children (the pipeline stages and three client spans) with a few
attributes each, handed to a processor that only keeps them. Then it encodes the kept
spans as the OTLP/HTTP exporter does (`encode_spans(...).SerializeToString()`, batches of
512, the batch processor's size). Prints the CPU time (`time.process_time`) per span and
per turn for each part, medians of `--rounds`, and writes `results/span_cost.json`. What a
server adds on top (the export's HTTP requests, garbage collection, the export thread
holding the interpreter lock) is in `tracing_overhead.py`.
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
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

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
    """CPU seconds per span to encode `spans` as OTLP protobuf, in export-sized batches."""
    started = time.process_time()
    for start in range(0, len(spans), BATCH):
        encode_spans(spans[start : start + BATCH]).SerializeToString()
    return (time.process_time() - started) / len(spans)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        keeper = Keeper()
        provider = TracerProvider(resource=Resource.create({"service.name": "chatqna"}))
        provider.add_span_processor(SimpleSpanProcessor(keeper))
        tracer = provider.get_tracer("chatqna")
        record(tracer, 100)  # warm-up
        keeper.spans.clear()
        per_turn = record(tracer, args.turns)
        per_span_encoded = encode(keeper.spans)
        rounds.append(
            {
                "record_us_per_span": per_turn / SPANS_PER_TURN * 1e6,
                "record_us_per_turn": per_turn * 1e6,
                "encode_us_per_span": per_span_encoded * 1e6,
                "encode_us_per_turn": per_span_encoded * SPANS_PER_TURN * 1e6,
            }
        )
        provider.shutdown()
    summary: dict[str, Any] = {
        key: round(statistics.median(r[key] for r in rounds), 1) for key in rounds[0]
    }
    summary["total_us_per_turn"] = round(
        summary["record_us_per_turn"] + summary["encode_us_per_turn"], 1
    )
    print(f"OpenTelemetry SDK, {SPANS_PER_TURN} spans a turn, medians of {args.rounds} rounds:")
    print("| part | µs CPU per span | µs CPU per turn |")
    print("|---|---|---|")
    print(
        f"| start, fill and end (SDK) | {summary['record_us_per_span']:.1f} "
        f"| {summary['record_us_per_turn']:.0f} |"
    )
    print(
        f"| OTLP protobuf encoding | {summary['encode_us_per_span']:.1f} "
        f"| {summary['encode_us_per_turn']:.0f} |"
    )
    print(f"| together | | {summary['total_us_per_turn']:.0f} |")
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
