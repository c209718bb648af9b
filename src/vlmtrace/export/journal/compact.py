"""Journal format 3 (docs/journal.md, Format 3): a memory reading is an array over the keys the header
declares, an attribute whose name the header declares is written under its index, a link to a span whose
start record is in the same file is that span's id, and an end record leaves out what its own start
record, in the same file, already said.

The journal's thread encodes through one `Compactor` per writer (with `VLMTRACE_JOURNAL_SYNC=1`, the
span's thread), never the request path: it remembers, by span id, what each start record it wrote said,
until the span's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vlmtrace import semconv as sc
from vlmtrace.export.journal import records

MEM_KEYS = sc.JOURNAL_MEM_KEYS  # the read time first: its slot holds an offset from the record's time
_SLOTS = len(MEM_KEYS)
_INDEX = {key: slot for slot, key in enumerate(MEM_KEYS)}
# Starts remembered until their end (a service has a few thousand spans in flight); past it the oldest is
# forgotten, and its end, if it comes, is written whole.
MAX_REMEMBERED = 16_384
_ABSENT = object()
ATTR_KEYS = sc.JOURNAL_ATTR_KEYS
_ATTR_INDEX = {key: str(index) for index, key in enumerate(ATTR_KEYS)}


def attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes with each name ATTR_KEYS declares written as its index; any other name in full, behind
    a `=` where it is made of digits only or starts with `=` (a reader would take it for an index)."""
    index = _ATTR_INDEX
    written = {}
    for key, value in values.items():
        short = index.get(key)
        if short is None:
            short = "=" + key if type(key) is str and (key[:1] == "=" or (key.isdigit() and key.isascii())) else key
        written[short] = value
    return written


def reading(values: Mapping[str, Any], t: int) -> list[Any] | Mapping[str, Any]:
    """A memory reading as an array in MEM_KEYS order (null where a key is absent, trailing nulls left
    out), its read time as an offset from the record's time `t`; the mapping itself where it has a key
    outside MEM_KEYS, a null value, or a read time that is not an integer."""
    row: list[Any] = [None] * _SLOTS
    last = -1
    index = _INDEX
    for key, value in values.items():
        slot = index.get(key)
        if slot is None or value is None:
            return values
        row[slot] = value
        last = max(last, slot)
    del row[last + 1 :]
    if row and row[0] is not None:
        if type(row[0]) is not int:
            return values
        row[0] -= t
    return row


class Compactor:
    """Encodes records as format 3 writes them: one per journal writer. A span's fields as the recorder
    queued them (records.start_from_ids, records.end_from_ids) are encoded without the format 2 record
    between: its ids stay ints until they are written, and an end compares them as ints."""

    def __init__(self) -> None:
        # span id (hex) -> (trace id, parent id, name, kind, start time, attributes, reading, links), the ids
        # and links as the start's writer gave them (ints and span contexts, or hex and link records)
        self._starts: dict[str, tuple] = {}
        self._traces: dict[str, str] = {}  # span id -> trace id (hex) of the starts written in this file

    def _linked(self, links: list) -> list:
        """Links with each one to a span whose start this file holds written as that span's id alone."""
        traces = self._traces
        return [
            link["span_id"]
            if type(link) is dict
            and len(link) == 2
            and type(link.get("span_id")) is str
            and traces.get(link["span_id"], _ABSENT) == link.get("trace_id")
            else link
            for link in links
        ]

    def forget(self) -> None:
        """A new file (rotation, a forked child), or records lost: ends are written whole until their
        start is written again in the same file."""
        self._starts.clear()
        self._traces.clear()

    def encode(self, record: Mapping[str, Any] | tuple) -> bytes:
        """One JSON line, from a record or a span's fields as the recorder queued them (records.encode)."""
        if isinstance(record, tuple):
            builder = record[0]
            if builder is records.start_from_ids:
                return self._start_from_ids(record[1:])
            if builder is records.end_from_ids:
                return records.dumps(self._linked_end(self._end_from_ids(record[1:])))
            return self._encode_record(builder(*record[1:]))
        return self._encode_record(record)

    def _encode_record(self, record: Mapping[str, Any]) -> bytes:
        kind = record.get("k")
        try:
            if kind == "start":
                return self._start(record)
            if kind == "end":
                return records.dumps(self._linked_end(self._end(record)))
        except (KeyError, TypeError):  # not the recorder's record (e.g. format 1's, readings among the attributes)
            return records.dumps(record)  # written as given: its start is not remembered, its end is whole
        if kind == "sample":
            t, values = record["t"], record["attrs"]
            compact = reading(values, t)
            return records.dumps({"k": "sample", "t": t, "mem": compact} if type(compact) is list else record)
        return records.dumps(record)

    def _start_from_ids(self, fields: tuple) -> bytes:
        """The start record of a span's fields as the recorder queued them (records.start_from_ids' arguments)."""
        t, trace_id, span_id, parent_id, name, kind, thread, attrs, mem, links = fields
        span_hex = "%016x" % span_id
        compact: dict[str, Any] = {"k": "start", "t": t, "trace_id": "%032x" % trace_id, "span_id": span_hex}
        if parent_id is not None:
            compact["parent_id"] = "%016x" % parent_id
        line = self._rest_of_start(compact, name, kind, thread, attrs, mem, records.hex_links(links))
        self._remember(span_hex, (trace_id, parent_id, name, kind, t, attrs, mem, links))
        return line

    def _start(self, record: Mapping[str, Any]) -> bytes:
        span_id, parent, kind, links = record["span_id"], record["parent_id"], record["kind"], record["links"]
        compact: dict[str, Any] = {"k": "start", "t": record["t"], "trace_id": record["trace_id"], "span_id": span_id}
        if parent is not None:
            compact["parent_id"] = parent
        line = self._rest_of_start(
            compact, record["name"], kind, record["thread"], record["attrs"], record["mem"], links
        )
        self._remember(
            span_id,
            (record["trace_id"], parent, record["name"], kind, record["t"], record["attrs"], record["mem"], links),
        )
        return line

    def _linked_end(self, end: dict[str, Any]) -> dict[str, Any]:
        if "links" in end:
            end["links"] = self._linked(end["links"])
        return end

    def _rest_of_start(
        self,
        compact: dict[str, Any],
        name: str,
        kind: str,
        thread: str,
        attrs: Any,
        mem: Mapping[str, Any],
        links: Any,
    ) -> bytes:
        compact["name"] = name
        if kind != "INTERNAL":
            compact["kind"] = kind
        compact["thread"] = thread
        compact["attrs"] = attributes(attrs)
        compact["mem"] = reading(mem, compact["t"])
        if links:
            compact["links"] = self._linked(links)
        traces, span_hex = self._traces, compact["span_id"]
        if len(traces) >= MAX_REMEMBERED and span_hex not in traces:
            del traces[next(iter(traces))]
        traces[span_hex] = compact["trace_id"]
        return records.dumps(compact)

    def _remember(self, span_hex: str, started: tuple) -> None:
        starts = self._starts
        if len(starts) >= MAX_REMEMBERED and span_hex not in starts:
            del starts[next(iter(starts))]
        starts[span_hex] = started

    def _against_start(
        self,
        span_hex: str,
        identity: tuple,
        t: int,
        status: str,
        status_message: str | None,
        attrs: Mapping[str, Any],
        mem: Mapping[str, Any],
        mem0: Mapping[str, Any] | None,
    ) -> tuple[dict[str, Any], tuple] | None:
        """The end without what its remembered start said (ids, name, kind, start time), and that start;
        None where the end must be written whole: its start not remembered or not this span's, an
        attribute removed or set to null since the start, or attribute values that cannot be compared."""
        started = self._starts.pop(span_hex, None)
        if started is None or started[:5] != identity:
            return None
        try:
            return _compact_end(t, span_hex, status, status_message, attrs, mem, mem0, started), started
        except Exception:  # noqa: BLE001 - odd attribute values (that cannot be compared): written whole
            return None

    def _end_from_ids(self, fields: tuple) -> dict[str, Any]:
        """The end record of a span's fields as the recorder queued them (records.end_from_ids' arguments)."""
        t, start, trace_id, span_id, parent_id, name, kind, status, status_message, attrs, mem, mem0, events, links = (
            fields
        )
        found = self._against_start(
            "%016x" % span_id, (trace_id, parent_id, name, kind, start), t, status, status_message, attrs, mem, mem0
        )
        if found is not None:
            compact, started = found
            if links and tuple(links) != started[7]:
                compact["links"] = records.hex_links(links)
            if events:
                compact["events"] = records.event_list(events)
            return compact
        return _whole_end(records.end_from_ids(*fields))

    def _end(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The end record without what its start said: its ids, name, kind and start time, the attributes
        unchanged since the start, the readings that are the start's. Written whole where its start is not
        remembered, or where leaving that out would change what a reader makes of it (an attribute
        removed since the start, or set to null)."""
        found = self._against_start(
            record["span_id"],
            (record["trace_id"], record["parent_id"], record["name"], record["kind"], record["start"]),
            record["t"],
            record["status"],
            record["status_message"],
            record["attrs"],
            record["mem"],
            record.get("mem0"),
        )
        if found is not None:
            compact, started = found
            links = record["links"]
            if links and links != started[7]:
                compact["links"] = links
            if record["events"]:
                compact["events"] = record["events"]
            return compact
        return _whole_end(record)


class _Whole(Exception):
    """An end record that must be written whole."""


def _compact_end(
    t: int,
    span_hex: str,
    status: str,
    status_message: str | None,
    attrs: Mapping[str, Any],
    mem: Mapping[str, Any],
    mem0: Mapping[str, Any] | None,
    started: tuple,
) -> dict[str, Any]:
    """What an end says that its start did not (its links and events are the caller's)."""
    start_attrs, start_mem = started[5], started[6]
    compact: dict[str, Any] = {"k": "end", "t": t, "span_id": span_hex}
    if status != "UNSET":
        compact["status"] = status
    if status_message is not None:
        compact["status_message"] = status_message
    changed = {}
    common = 0
    for key, value in attrs.items():
        before = start_attrs.get(key, _ABSENT)
        if before is not _ABSENT:
            common += 1
            if before is value or (type(before) is type(value) and before == value):
                continue
        if value is None:
            raise _Whole
        changed[key] = value
    if common != len(start_attrs):
        raise _Whole  # an attribute removed since the start: a reader would bring it back
    if changed:
        compact["attrs"] = attributes(changed)
    at_start = mem if mem0 is None else mem0
    if mem is not start_mem and mem != start_mem:
        compact["mem"] = reading(mem, t)
    if at_start is not start_mem and at_start != start_mem:
        compact["mem0"] = reading(at_start, t)
    return compact


def _whole_end(record: Mapping[str, Any]) -> dict[str, Any]:
    """An end record with every field but the defaults (kind INTERNAL, no parent, status UNSET, no message,
    events or links), readings as arrays."""
    t = record["t"]
    whole: dict[str, Any] = {
        "k": "end",
        "t": t,
        "start": record["start"],
        "trace_id": record["trace_id"],
        "span_id": record["span_id"],
    }
    if record["parent_id"] is not None:
        whole["parent_id"] = record["parent_id"]
    whole["name"] = record["name"]
    if record["kind"] != "INTERNAL":
        whole["kind"] = record["kind"]
    if record["status"] != "UNSET":
        whole["status"] = record["status"]
    if record["status_message"] is not None:
        whole["status_message"] = record["status_message"]
    if record["events"]:
        whole["events"] = record["events"]
    whole["attrs"] = attributes(record["attrs"])
    whole["mem"] = reading(record["mem"], t)
    if record.get("mem0") is not None:
        whole["mem0"] = reading(record["mem0"], t)
    if record["links"]:
        whole["links"] = record["links"]
    return whole
