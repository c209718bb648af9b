"""Journal format 3 (docs/journal.md, Format 3): a memory reading is an array over the keys the header
declares, and an end record leaves out what its own start record, in the same file, already said.

The journal's thread encodes through one `Compactor` per writer (with `VLMTRACE_JOURNAL_SYNC=1`, the
span's thread), never the request path: it remembers, by span id, what each start record it wrote said,
until the span's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vlmtrace import semconv as sc
from vlmtrace.export.journal import records

MEM_KEYS = sc.JOURNAL_MEM_KEYS
_SLOTS = len(MEM_KEYS)
_INDEX = {key: slot for slot, key in enumerate(MEM_KEYS)}
# Starts remembered until their end (a service has a few thousand spans in flight); past it the oldest is
# forgotten, and its end, if it comes, is written whole.
MAX_REMEMBERED = 16_384
_ABSENT = object()


class Whole(Exception):
    """An end record that must be written whole (see `Compactor._end`)."""


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
    """Encodes records as format 3 writes them: one per journal writer."""

    def __init__(self) -> None:
        # span id (hex) -> (trace id, parent id, name, kind, start time, attributes, reading, links)
        self._starts: dict[str, tuple] = {}

    def forget(self) -> None:
        """A new file (rotation, a forked child), or records lost: ends are written whole until their
        start is written again in the same file."""
        self._starts.clear()

    def encode(self, record: Mapping[str, Any] | tuple) -> bytes:
        """One JSON line, from a record or a span's fields as the recorder queued them (records.encode)."""
        record = records.built(record)
        kind = record.get("k")
        if kind == "start":
            return self._start(record)
        if kind == "end":
            return records.dumps(self._end(record))
        if kind == "sample":
            t, values = record["t"], record["attrs"]
            compact = reading(values, t)
            return records.dumps({"k": "sample", "t": t, "mem": compact} if type(compact) is list else record)
        return records.dumps(record)

    def _start(self, record: Mapping[str, Any]) -> bytes:
        t, span_id, parent, kind, links = (
            record["t"],
            record["span_id"],
            record["parent_id"],
            record["kind"],
            record["links"],
        )
        compact: dict[str, Any] = {"k": "start", "t": t, "trace_id": record["trace_id"], "span_id": span_id}
        if parent is not None:
            compact["parent_id"] = parent
        compact["name"] = record["name"]
        if kind != "INTERNAL":
            compact["kind"] = kind
        compact["thread"] = record["thread"]
        compact["attrs"] = record["attrs"]
        compact["mem"] = reading(record["mem"], t)
        if links:
            compact["links"] = links
        line = records.dumps(compact)
        starts = self._starts
        if len(starts) >= MAX_REMEMBERED and span_id not in starts:
            del starts[next(iter(starts))]
        starts[span_id] = (record["trace_id"], parent, record["name"], kind, t, record["attrs"], record["mem"], links)
        return line

    def _end(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The end record without what its start said: its ids, name, kind and start time, the attributes
        unchanged since the start, the readings that are the start's. Written whole where its start is not
        remembered, or where leaving that out would change what a reader makes of it (an attribute
        removed since the start, or set to null)."""
        started = self._starts.pop(record["span_id"], None)
        if started is not None:
            try:
                return self._compact_end(record, started)
            except Exception:  # noqa: BLE001 - odd attribute values (that cannot be compared): written whole
                pass
        return _whole_end(record)

    @staticmethod
    def _compact_end(record: Mapping[str, Any], started: tuple) -> dict[str, Any]:
        trace_id, parent, name, kind, start, start_attrs, start_mem, start_links = started
        if (trace_id, parent, name, kind, start) != (
            record["trace_id"],
            record["parent_id"],
            record["name"],
            record["kind"],
            record["start"],
        ):
            raise Whole
        t = record["t"]
        compact: dict[str, Any] = {"k": "end", "t": t, "span_id": record["span_id"]}
        _defaults_left_out(record, compact)
        changed = {}
        common = 0
        for key, value in record["attrs"].items():
            before = start_attrs.get(key, _ABSENT)
            if before is not _ABSENT:
                common += 1
                if before is value or (type(before) is type(value) and before == value):
                    continue
            if value is None:
                raise Whole
            changed[key] = value
        if common != len(start_attrs):
            raise Whole
        if changed:
            compact["attrs"] = changed
        mem, mem0 = record["mem"], record.get("mem0")
        at_start = mem if mem0 is None else mem0
        if mem is not start_mem and mem != start_mem:
            compact["mem"] = reading(mem, t)
        if at_start is not start_mem and at_start != start_mem:
            compact["mem0"] = reading(at_start, t)
        links = record["links"]
        if links and links != start_links:
            compact["links"] = links
        return compact


def _defaults_left_out(record: Mapping[str, Any], compact: dict[str, Any]) -> None:
    """Status, its message and events, where they are not the defaults (UNSET, none, none)."""
    if record["status"] != "UNSET":
        compact["status"] = record["status"]
    if record["status_message"] is not None:
        compact["status_message"] = record["status_message"]
    if record["events"]:
        compact["events"] = record["events"]


def _whole_end(record: Mapping[str, Any]) -> dict[str, Any]:
    """An end record with every field but the defaults (kind INTERNAL, no parent, no links), readings as arrays."""
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
    _defaults_left_out(record, whole)
    whole["attrs"] = record["attrs"]
    whole["mem"] = reading(record["mem"], t)
    if record.get("mem0") is not None:
        whole["mem0"] = reading(record["mem0"], t)
    if record["links"]:
        whole["links"] = record["links"]
    return whole
