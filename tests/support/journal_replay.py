"""Replay a recorded journal's ended spans over OTLP, as vlmtrace's own export would have sent them.

Each `end` record becomes the SDK `ReadableSpan` that `ExportBridge` builds for a live span (memory
readings merged by `semconv.span_memory_attributes`, links, events, status), with the header's
Resource, and goes out through the OpenTelemetry SDK's OTLP exporter. What OTLP cannot carry stays
behind: memory samples, spans still in flight, the crash text, the end marker.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.compact_records import FullRecords

BATCH = 512


def _records(path: Path) -> Iterator[dict]:
    """The journal's records as format 2 writes them (a format 3 end completed from its start)."""
    opener = gzip.open if path.suffix == ".gz" else open
    full = FullRecords()
    with opener(path, "rb") as lines:
        for line in lines:
            try:
                record = orjson.loads(line.strip(b"\0"))
            except orjson.JSONDecodeError:  # the zero bytes and faulthandler text of a crashed writer
                continue
            if type(record) is dict and (record := full.full(record)) is not None:
                yield record


def span_context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _span(record: dict, resource: Resource, scope: InstrumentationScope, shift_ns: int) -> ReadableSpan:
    memory = record.get("mem") or {}
    attributes = {**sc.span_memory_attributes(record.get("mem0") or memory, memory), **record["attrs"]}
    return ReadableSpan(
        name=record["name"],
        context=span_context(record["trace_id"], record["span_id"]),
        parent=span_context(record["trace_id"], record["parent_id"]) if record.get("parent_id") else None,
        resource=resource,
        attributes=attributes,
        events=tuple(Event(e["name"], e.get("attrs") or {}, e["t"] + shift_ns) for e in record.get("events") or ()),
        links=tuple(Link(span_context(link["trace_id"], link["span_id"])) for link in record.get("links") or ()),
        kind=SpanKind[record.get("kind", "INTERNAL")],
        status=Status(StatusCode[record.get("status", "UNSET")], record.get("status_message")),
        start_time=record["start"] + shift_ns,
        end_time=record["t"] + shift_ns,
        instrumentation_scope=scope,
    )


def journal_spans(path: Path, service_name: str | None = None, end_at_ns: int | None = None) -> list[ReadableSpan]:
    """The journal's ended spans; `service_name` replaces the recorded one, `end_at_ns` moves the
    whole run in time (all spans by the same amount) so that its last span ends then."""
    records = list(_records(path))
    header = next(r for r in records if r.get("k") == "header")
    resource = Resource(dict(header["resource"], **({"service.name": service_name} if service_name else {})))
    scope = InstrumentationScope(sc.INSTRUMENTATION_SCOPE, header["resource"].get(sc.RESOURCE_VLMTRACE_VERSION))
    ends = [r for r in records if r.get("k") == "end"]
    shift_ns = end_at_ns - max(r["t"] for r in ends) if end_at_ns is not None else 0
    return [_span(record, resource, scope, shift_ns) for record in ends]


def replay(spans: list[ReadableSpan], exporter: SpanExporter) -> None:
    """Export in the batch processor's batch size; fails loudly if the receiver refuses a batch."""
    for start in range(0, len(spans), BATCH):
        result = exporter.export(spans[start : start + BATCH])
        if result is not SpanExportResult.SUCCESS:
            raise RuntimeError(f"the OTLP receiver refused spans {start}..{start + BATCH}: {result}")
    exporter.shutdown()
