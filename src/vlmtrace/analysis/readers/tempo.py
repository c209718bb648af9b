"""Grafana Tempo trace-by-id responses: v1 `{"batches": […]}` and v2 `{"trace": {"resourceSpans": […]}}`."""

from __future__ import annotations

from vlmtrace.analysis.readers.otlp_json import add_resource_spans
from vlmtrace.analysis.trace_data import TraceData


def add_v1_response(data: TraceData, document: dict, source: str, line: int) -> int:
    return add_resource_spans(data, document.get("batches"), source, line, "batches")


def add_v2_response(data: TraceData, document: dict, source: str, line: int) -> int:
    trace = document.get("trace")
    if not isinstance(trace, dict):
        data.problem(source, line, "Tempo v2 response: 'trace' is not an object")
        return 0
    if "batches" in trace:
        return add_resource_spans(data, trace["batches"], source, line, "trace.batches")
    return add_resource_spans(data, trace.get("resourceSpans", []), source, line, "trace.resourceSpans")
