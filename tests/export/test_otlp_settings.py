"""One source for each OTLP setting: what comes from OTEL_EXPORTER_OTLP_* is left to the exporters, which
apply the specification's rules (signal paths, headers) themselves; seen from a receiving HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from vlmtrace.config import Options
from vlmtrace.export.metrics import otlp_metric_reader
from vlmtrace.export.otlp import otlp_span_processor


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the name http.server calls
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.received.append((self.path, self.headers.get("x-tenant")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_exporters_apply_the_otel_exporter_otlp_variables_themselves(receiver, monkeypatch):
    base = f"http://127.0.0.1:{receiver.server_port}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{base}/prefix")  # each signal's path appended
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{base}/traces-here")  # for traces only, as given
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=t-7")
    options = Options.resolve({"journal": None})
    spans = otlp_span_processor(options, None)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(spans)
    metrics = MeterProvider(metric_readers=[otlp_metric_reader(options)], shutdown_on_exit=False)
    try:
        with provider.get_tracer("t").start_as_current_span("s"):
            pass
        metrics.get_meter("t").create_counter("c").add(1)
        assert provider.force_flush() and metrics.force_flush()  # each returns once its export was answered
    finally:
        metrics.shutdown()
        provider.shutdown()

    assert sorted(set(receiver.received)) == [("/prefix/v1/metrics", "t-7"), ("/traces-here", "t-7")]
