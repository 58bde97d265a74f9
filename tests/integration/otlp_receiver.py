"""Minimal OTLP traces receivers on loopback: over HTTP (protobuf, gzip or not, over
keep-alive connections, which it counts; it can answer its first requests with error
statuses) and over gRPC (opentelemetry-proto's service on grpcio); and a collector that
accepts connections and never answers."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class ReceivedSpans:
    """Spans received so far, as `(service name, span name, attributes, parent span id)`."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.refused = 0
        self.connections = 0
        self._lock = threading.Lock()

    def add(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(request)
            self.content_types.append(headers.get("content-type", ""))
            self.headers.append(headers)

    def span_count(self) -> int:
        """How many spans arrived (without decoding each into a dict)."""
        with self._lock:
            return sum(
                len(scope_spans.spans)
                for request in self.requests
                for resource_spans in request.resource_spans
                for scope_spans in resource_spans.scope_spans
            )

    def spans(self) -> list[dict[str, Any]]:
        found = []
        with self._lock:
            for request in self.requests:
                for resource_spans in request.resource_spans:
                    service = next(
                        (
                            a.value.string_value
                            for a in resource_spans.resource.attributes
                            if a.key == "service.name"
                        ),
                        "",
                    )
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            found.append(
                                {
                                    "service": service,
                                    "name": span.name,
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent_span_id": span.parent_span_id.hex(),
                                    "attributes": {a.key: a.value for a in span.attributes},
                                }
                            )
        return found


@contextmanager
def otlp_receiver(
    refuse_with: Sequence[int] = (), port: int = 0
) -> Iterator[tuple[str, ReceivedSpans]]:
    """Serve `POST /v1/traces` on loopback (a free port unless given); yields its base URL
    and the store. The first requests are answered with the statuses of `refuse_with`, one
    each. `GET /` answers how many spans have arrived."""
    received = ReceivedSpans()
    refusals = list(refuse_with)

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as a collector does: a sender's connection carries many batches.
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            with received._lock:
                received.connections += 1

        def do_GET(self) -> None:  # how many spans have arrived (a readiness probe too)
            count = str(received.span_count()).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(count)))
            self.end_headers()
            self.wfile.write(count)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with received._lock:
                status = refusals.pop(0) if refusals else None
                if status is not None:
                    received.refused += 1
            if status is not None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.add(request, {k.lower(): v for k, v in self.headers.items()})
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: ReceivedSpans) -> None:
        self.received = received

    def Export(  # the generated service's method name
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        metadata = {key: str(value) for key, value in context.invocation_metadata()}
        self.received.add(request, {"content-type": "application/grpc", **metadata})
        return ExportTraceServiceResponse()


@contextmanager
def otlp_grpc_receiver() -> Iterator[tuple[str, ReceivedSpans]]:
    """Serve OTLP/gRPC's TraceService on a free loopback port; yields `http://host:port` and
    the store."""
    received = ReceivedSpans()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(received), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


@contextmanager
def otlp_black_hole() -> Iterator[tuple[str, list[socket.socket]]]:
    """A loopback port that accepts connections and never reads or answers; yields its URL
    and the connections accepted so far."""
    accepted: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:  # the listener is closed
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


if __name__ == "__main__":  # python -m tests.integration.otlp_receiver PORT: serve until killed
    import sys

    with otlp_receiver(port=int(sys.argv[1])):
        threading.Event().wait()
