"""Journal format 3's records read back as format 2 writes them (docs/journal.md, Format 3).

Format 3 writes a memory reading as an array over the keys its header declares (`mem_keys`), leaves
out the fields that hold their default (kind INTERNAL, no parent, status UNSET, no message, events or
links), and writes an end record whose start record is in the same journal without what that start
said: its ids, name, kind, start time, the attributes unchanged since the start, and the readings that
are the start's. The readers complete each record here, so the analysis sees what format 2 would have
given it. Nothing here raises on a malformed record: a compact end whose start is missing or not a
record comes back as None.
"""

from __future__ import annotations

from typing import Any

import orjson

from vlmtrace import semconv as sc

MAX_MEM_KEYS = 256  # of a header's `mem_keys`; a longer list is not one a writer declares


def declared_keys(header: dict) -> tuple[str, ...] | None:
    """The memory reading keys a format 3 header declares (the ones this version writes where the list
    is missing or not a list of names); None for the formats before 3, whose readings are objects."""
    version = header.get("v")
    if type(version) is not int or version < 3:
        return None
    keys = header.get("mem_keys")
    if type(keys) is list and len(keys) <= MAX_MEM_KEYS and all(type(key) is str for key in keys):
        return tuple(keys)
    return sc.JOURNAL_MEM_KEYS


def memory(value: Any, keys: tuple[str, ...], t: Any) -> Any:
    """A reading written as an array, as the object it stands for (its read time back from an offset to
    the record's time `t`); any other value as it is."""
    if type(value) is not list:
        return value
    reading = {key: item for key, item in zip(keys, value, strict=False) if item is not None}
    offset = reading.get(sc.MEM_READ_TIME)
    if offset is not None:
        if type(offset) is int and type(t) is int:
            reading[sc.MEM_READ_TIME] = t + offset
        else:
            del reading[sc.MEM_READ_TIME]  # no time to place it at
    return reading


def start_fields(record: dict, keys: tuple[str, ...]) -> dict:
    """A format 3 start record as format 2 writes it."""
    full = {"kind": "INTERNAL", "parent_id": None, "links": [], **record}
    full["mem"] = memory(record.get("mem"), keys, record.get("t"))
    return full


def end_fields(record: dict, started: bytes | dict | None, keys: tuple[str, ...]) -> dict | None:
    """A format 3 end record as format 2 writes it: a compact one (without `trace_id`) completed from its
    start record (`started`: its line as read, or the record); None where that start is needed and missing
    or not a record."""
    t = record.get("t")
    if "trace_id" in record:  # written whole: its start was not at hand when it was written
        full = {
            "parent_id": None,
            "kind": "INTERNAL",
            "status": "UNSET",
            "status_message": None,
            "events": [],
            "links": [],
            **record,
        }
        full["mem"] = memory(record.get("mem", {}), keys, t)
        if "mem0" in record:
            full["mem0"] = memory(record["mem0"], keys, t)
        return full
    start = _parsed(started)
    if start is None:
        return None
    attributes = start.get("attrs")
    attributes = attributes if type(attributes) is dict else {}
    changed = record.get("attrs")
    if type(changed) is dict:
        attributes = {**attributes, **changed}
    at_start = memory(start.get("mem", {}), keys, start.get("t"))
    return {
        "k": "end",
        "t": t,
        "start": start.get("t"),
        "trace_id": start.get("trace_id"),
        "span_id": record.get("span_id"),
        "parent_id": start.get("parent_id"),
        "name": start.get("name"),
        "kind": start.get("kind", "INTERNAL"),
        "status": record.get("status", "UNSET"),
        "status_message": record.get("status_message"),
        "attrs": attributes,
        "mem": memory(record["mem"], keys, t) if "mem" in record else at_start,
        "mem0": memory(record["mem0"], keys, t) if "mem0" in record else at_start,
        "events": record.get("events", []),
        "links": record.get("links", start.get("links", [])),
    }


def _parsed(line: bytes | dict | None) -> dict | None:
    if line is None or isinstance(line, dict):
        return line
    try:
        start = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return start if type(start) is dict else None


class FullRecords:
    """One journal's records, in order, as format 2 writes them, for code that reads records one by one
    (tests, `vlmtrace top`): keeps the header's keys and each start until its end (bounded)."""

    MAX_WAITING = 4096  # starts kept for their end, as many as `vlmtrace top` keeps spans in flight; the oldest go

    def __init__(self) -> None:
        self.keys: tuple[str, ...] | None = None
        self._starts: dict[str, dict] = {}

    def full(self, record: dict) -> dict | None:
        """`record` as format 2 writes it; None for a compact end whose start is not at hand."""
        kind = record.get("k")
        if kind == "header":
            self.keys = declared_keys(record)
            self._starts.clear()
            return record
        keys = self.keys
        if keys is None:
            return record
        if kind == "start":
            span_id = record.get("span_id")
            if type(span_id) is str:
                if len(self._starts) >= self.MAX_WAITING:
                    del self._starts[next(iter(self._starts))]
                self._starts[span_id] = record
            return start_fields(record, keys)
        if kind == "end":
            span_id = record.get("span_id")
            start = self._starts.pop(span_id, None) if type(span_id) is str else None
            return end_fields(record, start, keys)
        if kind == "sample" and "mem" in record:
            return {"k": "sample", "t": record.get("t"), "attrs": memory(record["mem"], keys, record.get("t"))}
        return record
