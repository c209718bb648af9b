"""The journal's records (docs/journal.md): how each kind is built and encoded as one JSON line.

Every writer of journal records goes through these builders: the recorder for vlmtrace's own spans,
the span processor for other instrumentations' SDK spans, and the writer for its bookkeeping.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from vlmtrace import semconv
from vlmtrace.export.journal.redaction import redacted_argv

FORMAT_VERSION = 3

_NONE: tuple = ()


class Later:
    """An attribute value worked out off the request path, when the journal's thread encodes the record
    (or the SDK's span gets its attributes at the end): `work(*inputs)`, from small objects the span's code
    took while they were alive (a tensor of counts, never pixel data). None where `work` fails."""

    __slots__ = ("inputs", "work")

    def __init__(self, work: Callable[..., Any], *inputs: Any) -> None:
        self.work = work
        self.inputs = inputs

    def value(self) -> Any:
        try:
            return self.work(*self.inputs)
        except Exception:  # noqa: BLE001 - an attribute that cannot be worked out is left empty, never raised
            return None


def resolved(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """`attributes` with every `Later` value worked out (for the SDK's span)."""
    return {key: value.value() if type(value) is Later else value for key, value in attributes.items()}


def _encodable(value: Any) -> Any:
    return value.value() if type(value) is Later else str(value)


def encode(record: Mapping[str, Any] | tuple) -> bytes:
    """One `\\n`-terminated JSON line, from a record or from a span's fields as the recorder queued them (a
    tuple: the builder, then its arguments)."""
    return dumps(_built(record))


def _built(record: Mapping[str, Any] | tuple) -> Mapping[str, Any]:
    """The record, from a span's fields as the recorder queued them (a tuple: the builder, then its arguments)."""
    if isinstance(record, tuple):
        return record[0](*record[1:])
    return record


def dumps(record: Mapping[str, Any]) -> bytes:
    """One `\\n`-terminated JSON line; `Later` values are worked out here; values orjson cannot encode (ints
    past 64 bits, odd types) become strings."""
    try:
        return orjson.dumps(record, default=_encodable, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return orjson.dumps(_stringify_unencodable(record), default=_encodable, option=orjson.OPT_APPEND_NEWLINE)


def _stringify_unencodable(value: Any) -> Any:
    if type(value) is Later:
        return _stringify_unencodable(value.value())
    if isinstance(value, Mapping):
        return {str(k): _stringify_unencodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stringify_unencodable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    return value


def hex_links(contexts: Iterable[Any] | None) -> list[dict[str, str]] | tuple[()]:
    """The span contexts a span links to; most spans have none, and then no list is allocated."""
    if not contexts:
        return _NONE  # orjson writes a tuple as []
    return [{"trace_id": "%032x" % c.trace_id, "span_id": "%016x" % c.span_id} for c in contexts]


def start_record(
    t: int,
    trace_hex: str,
    span_hex: str,
    parent_hex: str | None,
    name: str,
    kind: str,
    thread: str,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    links: Any,
) -> dict[str, Any]:
    """A span started: `attrs` known at start (copied: the span goes on changing its own, and the record may
    be encoded later), `mem` the memory reading at start (a mapping nobody changes; empty where none)."""
    return _start(t, trace_hex, span_hex, parent_hex, name, kind, thread, dict(attrs), mem, links)


def _start(
    t: int,
    trace_hex: str,
    span_hex: str,
    parent_hex: str | None,
    name: str,
    kind: str,
    thread: str,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    links: Any,
) -> dict[str, Any]:
    return {
        "k": "start",
        "t": t,
        "trace_id": trace_hex,
        "span_id": span_hex,
        "parent_id": parent_hex,
        "name": name,
        "kind": kind,
        "thread": thread,
        "attrs": attrs,
        "mem": mem,
        "links": links,
    }


def end_record(
    t: int,
    start: int,
    trace_hex: str,
    span_hex: str,
    parent_hex: str | None,
    name: str,
    kind: str,
    status: str,
    status_message: str | None,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    mem0: Mapping[str, Any] | None,
    events: Any,
    links: Any,
) -> dict[str, Any]:
    """A span ended. `mem0`: the reading at start, given only where it is another reading than `mem`
    (on TurboMind most spans start and end on one sample)."""
    record = {
        "k": "end",
        "t": t,
        "start": start,
        "trace_id": trace_hex,
        "span_id": span_hex,
        "parent_id": parent_hex,
        "name": name,
        "kind": kind,
        "status": status,
        "status_message": status_message,
        "attrs": attrs,
        "mem": mem,
        "events": events,
        "links": links,
    }
    if mem0 is not None:
        record["mem0"] = mem0
    return record


def start_from_ids(
    t: int,
    trace_id: int,
    span_id: int,
    parent_id: int | None,
    name: str,
    kind: str,
    thread: str,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    links: Any,
) -> dict[str, Any]:
    """A `start` record from the span's ids as ints and its links as span contexts: built where it is
    encoded, off the request path (the recorder queues `(start_from_ids, t, ...)`; `attrs` already a copy)."""
    return _start(
        t,
        "%032x" % trace_id,
        "%016x" % span_id,
        None if parent_id is None else "%016x" % parent_id,
        name,
        kind,
        thread,
        attrs,
        mem,
        hex_links(links),
    )


def end_from_ids(
    t: int,
    start: int,
    trace_id: int,
    span_id: int,
    parent_id: int | None,
    name: str,
    kind: str,
    status: str,
    status_message: str | None,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    mem0: Mapping[str, Any] | None,
    events: Any,
    links: Any,
) -> dict[str, Any]:
    """An `end` record from the span's ids as ints, its events and links as the span has them (see
    `start_from_ids`)."""
    return end_record(
        t,
        start,
        "%032x" % trace_id,
        "%016x" % span_id,
        None if parent_id is None else "%016x" % parent_id,
        name,
        kind,
        status,
        status_message,
        attrs,
        mem,
        mem0,
        event_list(events),
        hex_links(links),
    )


def event_list(events: Iterable[Any] | None) -> list[dict[str, Any]] | tuple[()]:
    """Span events ({name, t, attrs}); any object with `name`, `timestamp` and `attributes`."""
    if not events:
        return _NONE
    return [{"name": e.name, "t": e.timestamp, "attrs": dict(e.attributes or {})} for e in events]


def sample_record(t: int, attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {"k": "sample", "t": t, "attrs": attrs if isinstance(attrs, dict) else dict(attrs)}


def capture_record(
    start: int,
    components: list[str],
    tool: str,
    reason: str,
    requests: int,
    seconds: float,
    stopped_by: str,
    rate_at_start: float | None,
    snapshot: str | None,
    sites: list[dict],
    sites_left_out: int,
    bytes_left_out: int,
) -> dict[str, Any]:
    """A capture window's allocation sites (vlmtrace/capture/; docs/capture.md): what the window allocated and
    kept, grouped by site, largest first. `snapshot`: the torch snapshot's file name, beside the journal."""
    return {
        "k": "capture",
        "t": time.time_ns(),
        "start": start,
        "components": components,
        "tool": tool,
        "reason": reason,
        "requests": requests,
        "seconds": round(seconds, 3),
        "stopped_by": stopped_by,
        "rate_at_start": rate_at_start,
        "snapshot": snapshot,
        "sites": sites,
        "sites_left_out": sites_left_out,
        "bytes_left_out": bytes_left_out,
    }


def warning_record(source: str, message: str) -> dict[str, Any]:
    return {"k": "warning", "t": time.time_ns(), "source": source, "message": message}


def dropped_record(otlp_spans: int, journal_records: int) -> dict[str, Any]:
    return {"k": "dropped", "t": time.time_ns(), "otlp_spans": otlp_spans, "journal_records": journal_records}


def disk_full_record(path: str) -> dict[str, Any]:
    """The journal stopped because its file system is full; later records are only counted (`dropped`)."""
    return {"k": "disk_full", "t": time.time_ns(), "path": path}


def end_marker_record(clean: bool, spans_started: int, spans_ended: int, ended_by: str | None) -> dict[str, Any]:
    """The journal's last record. `ended_by`: the signal that ended the process ("SIGTERM"), or "uncaught
    NAME"; absent for a plain exit (export/process_end.py)."""
    record = {
        "k": "end_marker",
        "t": time.time_ns(),
        "clean": clean,
        "spans_started": spans_started,
        "spans_ended": spans_ended,
    }
    if ended_by is not None:
        record["ended_by"] = ended_by
    return record


def header_record(seq: int, resource: Mapping[str, Any], versions: Mapping[str, str]) -> dict[str, Any]:
    return {
        "k": "header",
        "v": FORMAT_VERSION,
        "t": time.time_ns(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": socket.gethostname(),
        "seq": seq,
        "mem_keys": semconv.JOURNAL_MEM_KEYS,
        "attr_keys": semconv.JOURNAL_ATTR_KEYS,
        "resource": dict(resource),
        "versions": dict(versions),
        "argv": redacted_argv(sys.argv),
        "sampling": "all spans, whatever the tracer provider's sampler exports",
    }
