"""OTLP/JSON span decoding, shared by the collector file exporter, Jaeger API v3 and Tempo.

They all write `resourceSpans → scopeSpans → spans` (Tempo's old marshaller: `instrumentationLibrarySpans`),
but differ in details this module absorbs: ids in hex or base64, `kind`/`status.code` as numbers or
enum names, times as strings or numbers (sometimes overflowing), values typed as `intValue` strings.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from vlmtrace.analysis.readers import budget, typed
from vlmtrace.analysis.trace_data import TraceData

_HEX = re.compile(r"[0-9a-fA-F]+\Z")
_STATUS_NAMES = {
    0: "UNSET",
    1: "OK",
    2: "ERROR",
    "STATUS_CODE_UNSET": "UNSET",
    "STATUS_CODE_OK": "OK",
    "STATUS_CODE_ERROR": "ERROR",
}
INT64_MAX = 2**63 - 1


def hex_id(value: Any, size: int) -> str | None:
    """An id as lowercase hex: hex of the right length stays hex, anything else is tried as base64.

    Uppercase hex is also valid base64 (Tempo's own parser falls for it); the length decides.
    """
    if not isinstance(value, str) or not value:
        return None
    if len(value) == 2 * size and _HEX.match(value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.lower() if _HEX.match(value) else value
    if not raw.strip(b"\0"):
        return None
    return raw.hex()


def unix_nano(value: Any) -> int | None:
    """Nanoseconds from a string or a number; None when absent or outside int64 (Go's zero time)."""
    try:
        nanos = int(value)
    except (TypeError, ValueError):
        return None
    return nanos if 0 < nanos <= INT64_MAX else None


def any_value(value: Any) -> Any:
    """Decode an OTLP AnyValue (`{"intValue": "3"}` → 3)."""
    if type(value) is not dict:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        try:
            return int(value["intValue"])
        except (TypeError, ValueError):
            return None
    if "doubleValue" in value:
        try:
            return float(value["doubleValue"])
        except (TypeError, ValueError):
            return None
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        array = value["arrayValue"]
        values = array.get("values") if isinstance(array, dict) else None
        return [any_value(item) for item in values] if isinstance(values, list) else []
    if "kvlistValue" in value:
        kvlist = value["kvlistValue"]
        return attributes(kvlist.get("values") if isinstance(kvlist, dict) else None)
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def attributes(key_values: Any) -> dict:
    """`[{"key": k, "value": AnyValue}]` → `{k: value}`; malformed entries are left out (the types of the
    values the analysis reads are checked by `typed.checked_attributes`)."""
    result = {}
    if isinstance(key_values, list):
        for item in key_values:
            if type(item) is dict:
                key = item.get("key")
                if isinstance(key, str):
                    result[key] = any_value(item.get("value"))
    return result


def status_name(status: Any) -> str:
    code = status.get("code", 0) if isinstance(status, dict) else 0
    return _STATUS_NAMES.get(code, "UNSET") if isinstance(code, (int, str)) else "UNSET"


def process_label(resource: dict, fallback: str) -> str:
    """The same label the journal uses (`host:pid`), so a journal and its OTLP copy meet."""
    host = resource.get("host.name")
    pid = resource.get("process.pid")
    if isinstance(host, str) and type(pid) is int:
        return f"{host}:{pid}"
    for key in ("service.instance.id", "service.name"):
        if isinstance(resource.get(key), (str, int)) and resource[key]:
            return str(resource[key])[:200]
    return fallback


def add_resource_spans(data: TraceData, resource_spans: Any, source: str, line: int, where: str) -> int:
    """Append every span under `resource_spans`; returns how many were read."""
    if not isinstance(resource_spans, list):
        data.problem(source, line, f"{where}: expected a list of resource spans")
        return 0
    count = 0
    spending = budget.current()
    for r_index, resource_span in enumerate(resource_spans):
        if type(resource_span) is not dict:
            data.problem(source, line, f"{where}[{r_index}]: not an object")
            continue
        resource = resource_span.get("resource")
        resource_attributes = attributes(resource.get("attributes")) if isinstance(resource, dict) else {}
        process = resource_process(data, resource_attributes, source)
        spending.check()
        scopes = resource_span.get("scopeSpans")
        if scopes is None:
            scopes = resource_span.get("instrumentationLibrarySpans")
        if not isinstance(scopes, list):
            if scopes is not None:
                spending.skipped_record(f"{where}[{r_index}]", f"'scopeSpans' is {typed.type_name(scopes)}")
            continue
        for s_index, scope in enumerate(scopes):
            spans = scope.get("spans") if type(scope) is dict else None
            if not isinstance(spans, list):
                if spans is not None or type(scope) is not dict:
                    spending.skipped_record(
                        f"{where}[{r_index}].scopeSpans[{s_index}]",
                        f"not a scope with a list of spans ({typed.type_name(scope)})",
                    )
                continue
            for index, span in enumerate(spans):
                spending.tick()
                if type(span) is not dict:
                    data.problem(
                        source, line, f"{where}[{r_index}].scopeSpans[{s_index}].spans[{index}]: not an object"
                    )
                    continue
                trace_id, span_id, parent_id = (
                    hex_id(span.get("traceId"), 16),
                    hex_id(span.get("spanId"), 8),
                    hex_id(span.get("parentSpanId"), 8),
                )
                wrong = typed.wrong_head(trace_id, span_id, parent_id, span.get("name"))
                if wrong is not None:
                    spending.skipped_record(f"{where}[{r_index}].scopeSpans[{s_index}].spans[{index}]", wrong)
                    continue
                data.add_span(
                    process,
                    trace_id,
                    span_id,
                    parent_id,
                    span.get("name"),
                    status_name(span.get("status")),
                    unix_nano(span.get("startTimeUnixNano")),
                    unix_nano(span.get("endTimeUnixNano")),
                    typed.checked_attributes(attributes(span.get("attributes"))),
                )
                count += 1
    return count


def resource_process(data: TraceData, resource: dict, source: str) -> int:
    """The process a resource describes; its host, pid and service kept only where their type is right."""
    host, pid, service = resource.get("host.name"), resource.get("process.pid"), resource.get("service.name")
    return data.process(
        process_label(resource, source),
        host=host if isinstance(host, str) else None,
        pid=pid if type(pid) is int and 0 <= pid < 2**63 else None,
        service=service if isinstance(service, str) else None,
        resource=typed.cut_deep(resource, f"the resource of {source}"),
    )
