"""What one page of a trace search holds: each trace's id and earliest span start, and the page less the
traces already read. Jaeger API v3 (`{"result": {"resourceSpans": …}}`), API v1 (`{"data": [trace…]}`)
and Tempo's search (`{"traces": [{"traceID", "startTimeUnixNano"}…]}`).

Only ids and starts are read here, leniently: whatever else a page holds is left for the readers
(`jaeger`, `otlp_json`), which report what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from vlmtrace.analysis.readers.otlp_json import hex_id


def _nanos(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _earliest(starts: dict[str, int], trace: str | None, start: int | None) -> None:
    if trace is not None and start is not None:
        starts[trace] = min(start, starts.get(trace, start))


def _v3_spans(document: dict) -> Iterator[tuple[dict, dict, dict]]:
    result = document.get("result")
    for resource in result.get("resourceSpans") or () if isinstance(result, dict) else ():
        for scope in resource.get("scopeSpans") or () if isinstance(resource, dict) else ():
            for span in scope.get("spans") or () if isinstance(scope, dict) else ():
                if isinstance(span, dict):
                    yield resource, scope, span


def v3_starts(document: dict) -> dict[str, int]:
    starts: dict[str, int] = {}
    for _, _, span in _v3_spans(document):
        _earliest(starts, hex_id(span.get("traceId"), 16), _nanos(span.get("startTimeUnixNano")))
    return starts


def v3_only(document: dict, traces: Collection[str]) -> dict:
    """The page with the spans of `traces` only (and those without a readable trace id, for the reader
    to report)."""
    for _, scope, span in list(_v3_spans(document)):
        trace = hex_id(span.get("traceId"), 16)
        if trace is not None and trace not in traces:
            scope["spans"] = [other for other in scope["spans"] if other is not span]
    return document


def v1_starts(document: dict) -> dict[str, int]:
    starts: dict[str, int] = {}
    for trace in document.get("data") or () if isinstance(document.get("data"), list) else ():
        if isinstance(trace, dict) and isinstance(trace.get("traceID"), str) and isinstance(trace.get("spans"), list):
            readable = [_nanos(span.get("startTime")) for span in trace["spans"] if isinstance(span, dict)]
            micros = [value for value in readable if value is not None]
            _earliest(starts, trace["traceID"].lower(), min(micros) * 1000 if micros else None)
    return starts


def v1_only(document: dict, traces: Collection[str]) -> dict:
    if isinstance(document.get("data"), list):
        document["data"] = [
            trace
            for trace in document["data"]
            if not (isinstance(trace, dict) and isinstance(trace.get("traceID"), str))
            or trace["traceID"].lower() in traces
        ]
    return document


def tempo_starts(document: dict) -> dict[str, int]:
    starts: dict[str, int] = {}
    for trace in document.get("traces") or () if isinstance(document.get("traces"), list) else ():
        if isinstance(trace, dict) and trace.get("traceID"):
            _earliest(starts, str(trace["traceID"]), _nanos(trace.get("startTimeUnixNano")) or 0)
    return starts
