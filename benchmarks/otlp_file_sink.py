"""A minimal OTLP/HTTP receiver that writes what it receives to files: a collector for a machine with no network.

Every `POST /v1/traces` or `/v1/metrics` (protobuf, optionally gzip) is decoded and appended as one JSON
line (OTLP's JSON mapping, via opentelemetry-proto) to `traces.jsonl` or `metrics.jsonl` in the output
folder; the answer is an empty success, as a collector gives.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

_SIGNALS = {
    "/v1/traces": (
        "traces.jsonl",
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "/v1/metrics": (
        "metrics.jsonl",
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
}


class OtlpFileSink:
    """`with OtlpFileSink(folder) as sink:` listens on 127.0.0.1 (`sink.endpoint`) until the block ends."""

    def __init__(self, folder: Path, port: int = 0) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                signal = _SIGNALS.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if signal is None:
                    self.send_error(404)
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                name, request_type, response_type = signal
                message = json_format.MessageToDict(request_type.FromString(body))
                with sink._lock, open(sink.folder / name, "a") as out:
                    out.write(json.dumps(message) + "\n")
                answer = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-file-sink", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpFileSink:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _hex(value: str | None) -> str | None:
    """protobuf's JSON mapping writes ids as base64; traces are read in hex."""
    return base64.b64decode(value).hex() if value else None


def received_spans(folder: Path) -> list[dict]:
    """Every span received: `name`, hex `trace_id`/`span_id`/`parent_id`, `links` [(trace_id, span_id)],
    `attributes` and `resource` (plain dicts)."""
    spans = []
    for request in read_lines(Path(folder) / "traces.jsonl"):
        for resource_spans in request.get("resourceSpans", []):
            resource = attribute_dict(resource_spans.get("resource", {}).get("attributes", []))
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    spans.append(
                        {
                            "name": span.get("name"),
                            "trace_id": _hex(span.get("traceId")),
                            "span_id": _hex(span.get("spanId")),
                            "parent_id": _hex(span.get("parentSpanId")),
                            "links": [
                                (_hex(link.get("traceId")), _hex(link.get("spanId"))) for link in span.get("links", [])
                            ],
                            "attributes": attribute_dict(span.get("attributes", [])),
                            "resource": resource,
                        }
                    )
    return spans


def received_metric_names(folder: Path) -> dict[str, set[str]]:
    """{process.pid: names of the metrics received from it}."""
    names: dict[str, set[str]] = {}
    for request in read_lines(Path(folder) / "metrics.jsonl"):
        for resource_metrics in request.get("resourceMetrics", []):
            pid = str(attribute_dict(resource_metrics.get("resource", {}).get("attributes", [])).get("process.pid"))
            for scope_metrics in resource_metrics.get("scopeMetrics", []):
                names.setdefault(pid, set()).update(metric["name"] for metric in scope_metrics.get("metrics", []))
    return names


def attribute_dict(attributes: list[dict]) -> dict:
    """OTLP JSON's [{key, value: {stringValue|intValue|...}}] as a plain dict (ints stay strings, as in JSON)."""
    return {item["key"]: next(iter(item.get("value", {}).values()), None) for item in attributes}
