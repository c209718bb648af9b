"""Jaeger query responses: API v1 / UI JSON (`{"data": [trace…]}` or a bare trace) and API v3 (`{"result": …}`)."""

from __future__ import annotations

from typing import Any

import orjson

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers import budget, typed
from vlmtrace.analysis.readers.depth import text
from vlmtrace.analysis.readers.otlp_json import add_resource_spans, process_label, resource_process
from vlmtrace.analysis.trace_data import TraceData

# OTLP arrays reach Jaeger v1 as JSON text in a string tag; these are the ones the analysis reads.
_ARRAY_KEYS = frozenset({sc.MEM_DEVICES} | {key + sc.PER_DEVICE_SUFFIX for key in sc.MEM_PER_DEVICE_KEYS})


def _tags(tags: Any) -> dict:
    result = {}
    if isinstance(tags, list):
        for tag in tags:
            if type(tag) is dict and isinstance(tag.get("key"), str):
                value = tag.get("value")
                if tag.get("type") == "int64" and isinstance(value, str):
                    # Jaeger writes an int64 beyond 2**53 as a string (its UI reads JSON as doubles).
                    try:
                        value = int(value)
                    except ValueError:
                        value = None
                elif tag["key"] in _ARRAY_KEYS and isinstance(value, str) and value.startswith("["):
                    try:
                        value = orjson.loads(value)
                    except orjson.JSONDecodeError:
                        value = None
                result[tag["key"]] = value
    return result


def _parent(span: dict) -> str | None:
    """Jaeger's own rule (model.Span.ParentSpanID): the first CHILD_OF, else FOLLOWS_FROM, reference into
    the span's own trace. One into another trace is an OTLP link (an engine step's to its requests)."""
    references = span.get("references")
    trace_id = span.get("traceID")
    if isinstance(references, list):
        for ref_type in ("CHILD_OF", "FOLLOWS_FROM"):
            for reference in references:
                if (
                    type(reference) is dict
                    and reference.get("refType") == ref_type
                    and reference.get("traceID", trace_id) == trace_id
                ):
                    span_id = reference.get("spanID")
                    return span_id.lower() if isinstance(span_id, str) else None
    parent = span.get("parentSpanID")
    return parent.lower() if isinstance(parent, str) and parent.strip("0") else None


def _status(tags: dict) -> str:
    code = tags.get("otel.status_code")
    if isinstance(code, str) and code.upper() in ("OK", "ERROR"):
        return code.upper()
    return "ERROR" if tags.get("error") in (True, "true") else "UNSET"


def _micros_to_nanos(value: Any) -> int | None:
    return value * 1000 if type(value) is int and 0 < value < 2**53 else None


def add_v1_trace(data: TraceData, trace: Any, source: str, line: int, where: str) -> int:
    """One Jaeger v1 trace object (`traceID`, `spans`, `processes`)."""
    if type(trace) is not dict or not isinstance(trace.get("spans"), list):
        data.problem(source, line, f"{where}: not a Jaeger trace (no 'spans' list)")
        return 0
    listed = trace.get("processes")
    processes: dict[Any, Any] = listed if isinstance(listed, dict) else {}
    spending = budget.current()
    process_index: dict[str, int] = {}
    for key, entry in processes.items():
        described = entry if isinstance(entry, dict) else {}
        tags = _tags(described.get("tags"))
        tags.setdefault("service.name", described.get("serviceName"))
        tags.setdefault("host.name", tags.get("hostname"))
        process_index[key] = resource_process(data, {k: v for k, v in tags.items() if v is not None}, source)
        spending.check()
    count = 0
    for index, span in enumerate(trace["spans"]):
        spending.tick()
        if type(span) is not dict:
            data.problem(source, line, f"{where}.spans[{index}]: not an object")
            continue
        tags = _tags(span.get("tags"))
        process_id = span.get("processID")
        if not typed.text_or_none(process_id):
            spending.skipped_record(f"{where}.spans[{index}]", f"'processID' is {typed.type_name(process_id)}")
            continue
        process = process_index.get(process_id) if process_id is not None else None
        if process is None:
            process = data.process(process_label({}, source))
        start = _micros_to_nanos(span.get("startTime"))
        duration = span.get("duration")
        end = start + duration * 1000 if start is not None and type(duration) is int and duration >= 0 else None
        trace_id, span_id = span.get("traceID"), span.get("spanID")
        trace_id, span_id = (
            trace_id.lower() if isinstance(trace_id, str) else trace_id,
            span_id.lower() if isinstance(span_id, str) else span_id,
        )
        parent = _parent(span)
        wrong = typed.wrong_head(trace_id, span_id, parent, span.get("operationName"))
        if wrong is not None:
            spending.skipped_record(f"{where}.spans[{index}]", wrong)
            continue
        data.add_span(
            process,
            trace_id,
            span_id,
            parent,
            span.get("operationName"),
            _status(tags),
            start,
            end,
            typed.checked_attributes(tags),
        )
        count += 1
    return count


def add_v1_response(data: TraceData, document: dict, source: str, line: int) -> int:
    """`{"data": [trace, …], "errors": …}` from `/api/traces` or `/api/traces/{id}`."""
    traces = document.get("data")
    errors = document.get("errors")
    if errors:
        data.problem(source, line, f"Jaeger reported errors: {text(errors, 200)}")
    if not isinstance(traces, list):
        data.problem(source, line, "Jaeger v1 response: 'data' is not a list of traces")
        return 0
    return sum(add_v1_trace(data, trace, source, line, f"data[{i}]") for i, trace in enumerate(traces))


def add_v3_response(data: TraceData, document: dict, source: str, line: int) -> int:
    """`{"result": {"resourceSpans": […]}}` from `/api/v3/traces…` (grpc-gateway JSON)."""
    result = document.get("result")
    if not isinstance(result, dict):
        data.problem(source, line, "Jaeger v3 response: 'result' is not an object")
        return 0
    resource_spans = result.get("resourceSpans", [])
    count = add_resource_spans(data, resource_spans, source, line, "result.resourceSpans")
    _note_sender_limits(data, resource_spans, source, line)
    return count


_DROPPED = (
    ("droppedAttributesCount", "attributes", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"),
    ("droppedEventsCount", "events", "OTEL_SPAN_EVENT_COUNT_LIMIT"),
    ("droppedLinksCount", "links", "OTEL_SPAN_LINK_COUNT_LIMIT"),
)


def _note_sender_limits(data: TraceData, resource_spans: Any, source: str, line: int) -> None:
    """API v3 keeps the counts of what the sender's span limits dropped (API v1 shows none of them):
    a dropped attribute may be a memory reading, so the report says how many spans lost what."""
    spans = (
        [
            span
            for resource in resource_spans
            if type(resource) is dict
            for scope in _list(resource.get("scopeSpans"))
            if type(scope) is dict
            for span in _list(scope.get("spans"))
            if type(span) is dict
        ]
        if isinstance(resource_spans, list)
        else []
    )
    for field, what, limit in _DROPPED:
        counts = [span[field] for span in spans if type(span.get(field)) is int and 0 < span[field] < 2**63]
        if counts:
            data.problem(
                source,
                line,
                f"{len(counts)} span(s) arrived with {sum(counts)} {what} dropped by the "
                f"sender's span limits ({limit}); a dropped attribute may be a memory reading",
                "note",
            )


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []
