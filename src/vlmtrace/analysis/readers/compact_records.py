"""Journal format 3's records read back as format 2 writes them (docs/journal.md, Format 3).

Format 3 writes a memory reading as an array over the keys its header declares (`mem_keys`), an
attribute whose name the header declares (`attr_keys`) under that name's index, leaves
out the fields that hold their default (kind INTERNAL, no parent, status UNSET, no message, events or
links), and writes an end record whose start record is in the same journal without what that start
said: its ids, name, kind, start time, the attributes unchanged since the start, and the readings that
are the start's. The readers complete each record here, so the analysis sees what format 2 would have
given it. Nothing here raises on a malformed record: a compact end whose start is missing or not a
record comes back as None; an attribute whose index the header does not declare is dropped, counted on
the input's budget; a link written as a span id whose start is not in the file is left so, and the readers
drop it as a malformed link.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers import budget
from vlmtrace.analysis.readers.depth import text

MAX_MEM_KEYS = 256  # of a header's `mem_keys`; a longer list is not one a writer declares
MAX_ATTR_KEYS = 4096  # of a header's `attr_keys`, likewise
# Starts whose trace id a link written as a span id takes: twice as many as the writer remembers, so that
# a reader finds every one the writer wrote so.
LINKED_STARTS = 2 * 16_384


class Declared(NamedTuple):
    """What a format 3 header declares: its reading keys and its attribute names."""

    mem: tuple[str, ...]
    attrs: tuple[str, ...]


OWN = Declared(sc.JOURNAL_MEM_KEYS, sc.JOURNAL_ATTR_KEYS)  # what this version's writer declares


def declared(header: dict) -> Declared | None:
    """What a format 3 header declares: its reading keys (the ones this version writes where the list is
    missing or not a list of names) and attribute names (none where the list is missing or not a list of
    names: every index is then dropped); None for the formats before 3."""
    version = header.get("v")
    if type(version) is not int or version < 3:
        return None
    mem = _names(header.get("mem_keys"), MAX_MEM_KEYS) or sc.JOURNAL_MEM_KEYS
    return Declared(mem, _names(header.get("attr_keys"), MAX_ATTR_KEYS))


def _names(keys: Any, bound: int) -> tuple[str, ...]:
    if type(keys) is list and len(keys) <= bound and all(type(key) is str for key in keys):
        return tuple(keys)
    return ()


def is_index(key: str) -> bool:
    """Whether an attribute key is written as an index (a name of digits only is written behind a `=`)."""
    return key.isdigit() and key.isascii()


def named(attributes: Any, names: tuple[str, ...]) -> Any:
    """A record's attributes with each index as the name the header declares for it, and a name written
    behind a `=` without it; an index the header does not declare is dropped, counted on the input's
    budget. Anything but an object as it is."""
    if type(attributes) is not dict:
        return attributes
    full = {}
    for key, value in attributes.items():
        if is_index(key):
            slot = int(key) if len(key) < 7 and (key == "0" or key[0] != "0") else len(names)
            if slot >= len(names):
                budget.current().absent_field(f"attribute index {text(key, 40)!r} is not in the header's attr_keys")
                continue
            full[names[slot]] = value
        else:
            full[key[1:] if key[:1] == "=" else key] = value
    return full


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


def start_fields(record: dict, keys: Declared) -> dict:
    """A format 3 start record as format 2 writes it."""
    full = {"kind": "INTERNAL", "parent_id": None, "links": [], **record}
    full["mem"] = memory(record.get("mem"), keys.mem, record.get("t"))
    if "attrs" in record:
        full["attrs"] = named(record["attrs"], keys.attrs)
    return full


def end_fields(record: dict, started: bytes | dict | None, keys: Declared) -> dict | None:
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
        full["mem"] = memory(record.get("mem", {}), keys.mem, t)
        if "mem0" in record:
            full["mem0"] = memory(record["mem0"], keys.mem, t)
        if "attrs" in record:
            full["attrs"] = named(record["attrs"], keys.attrs)
        return full
    start = _parsed(started)
    if start is None:
        return None
    attributes = named(start.get("attrs"), keys.attrs)
    attributes = attributes if type(attributes) is dict else {}
    changed = record.get("attrs")
    if type(changed) is dict:
        attributes = {**attributes, **named(changed, keys.attrs)}
    mem = keys.mem
    at_start = memory(start.get("mem", {}), mem, start.get("t"))
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
        "mem": memory(record["mem"], mem, t) if "mem" in record else at_start,
        "mem0": memory(record["mem0"], mem, t) if "mem0" in record else at_start,
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


class LinkedStarts:
    """The trace id of a file's start records, by span id (the latest LINKED_STARTS of them), for the links
    written as the linked span's id alone."""

    def __init__(self) -> None:
        self._traces: dict[str, str] = {}

    def clear(self) -> None:
        """A new file: its links name the starts in it."""
        self._traces.clear()

    def remember(self, record: dict) -> None:
        span_id, trace_id, traces = record.get("span_id"), record.get("trace_id"), self._traces
        if type(span_id) is str and type(trace_id) is str:
            if len(traces) >= LINKED_STARTS and span_id not in traces:
                del traces[next(iter(traces))]
            traces[span_id] = trace_id

    def linked(self, links: Any) -> Any:
        """Links with each span id alone as the {trace_id, span_id} it stands for, where that span's start
        is at hand."""
        if type(links) is not list or not any(type(link) is str for link in links):
            return links
        traces = self._traces
        return [
            {"trace_id": traces[link], "span_id": link} if type(link) is str and link in traces else link
            for link in links
        ]

    def start_line(self, record: dict, line: bytes) -> bytes:
        """A start record's line with its links whole (the line as it is where none is a span id alone),
        the start remembered."""
        links = record.get("links")
        whole = self.linked(links)
        self.remember(record)
        return line if whole is links else orjson.dumps({**record, "links": whole})


class FullRecords:
    """One journal's records, in order, as format 2 writes them, for code that reads records one by one
    (tests, `vlmtrace top`): keeps the header's keys and each start until its end (bounded)."""

    MAX_WAITING = 4096  # starts kept for their end, as many as `vlmtrace top` keeps spans in flight; the oldest go

    def __init__(self) -> None:
        self.keys: Declared | None = None
        self._starts: dict[str, dict] = {}
        self._linked = LinkedStarts()

    def full(self, record: dict) -> dict | None:
        """`record` as format 2 writes it; None for a compact end whose start is not at hand."""
        kind = record.get("k")
        if kind == "header":
            self.keys = declared(record)
            self._starts.clear()
            self._linked.clear()
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
            full = start_fields(record, keys)
            full["links"] = self._linked.linked(full["links"])
            self._linked.remember(record)
            return full
        if kind == "end":
            span_id = record.get("span_id")
            start = self._starts.pop(span_id, None) if type(span_id) is str else None
            ended = end_fields(record, start, keys)
            if ended is not None:
                ended["links"] = self._linked.linked(ended["links"])
            return ended
        if kind == "sample" and "mem" in record:
            return {"k": "sample", "t": record.get("t"), "attrs": memory(record["mem"], keys.mem, record.get("t"))}
        return record
