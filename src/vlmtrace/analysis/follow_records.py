"""What a journal's records say of a process while it runs, for `vlmtrace top`: its state (`ProcessState`),
the spans in flight and the requests completed, and how each record changes them. Which files are read,
and how far, is `follow.py`'s.

Bounded whatever the records hold: spans in flight up to MAX_IN_FLIGHT per process, request readings up
to the follower's window, texts to MAX_TEXT characters, a faulthandler report to MAX_FATAL_LINES lines.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import socket
from typing import Any

from vlmtrace import semconv as sc

MAX_IN_FLIGHT = 4096
MAX_FATAL_LINES = 200
MAX_TEXT = 1000  # characters kept of a name, a host or a fatal line


@dataclasses.dataclass
class LiveSpan:
    name: str
    stage: str | None
    start_ns: int
    trace_id: str


@dataclasses.dataclass
class RequestReading:
    """One completed request: when it ended, and the memory reading then (its end's, sampled keys
    filled from the latest sample)."""

    end_ns: int
    reading: dict[str, Any]


@dataclasses.dataclass
class ProcessState:
    key: tuple[str, int]
    label: str
    host: str | None
    pid: int | None
    service: str | None
    first_record_ns: int | None = None
    last_record_ns: int | None = None
    clean_end: bool = False
    journal_stopped: bool = False  # disk_full: the journal ended early, the process did not
    dead: bool = False
    started_mid_file: bool = False  # the follower started reading after the file's first records
    latest_sample: dict[str, Any] = dataclasses.field(default_factory=dict)
    in_flight: dict[str, LiveSpan] = dataclasses.field(default_factory=dict)
    in_flight_left_out: int = 0
    requests_completed: int = 0
    requests: collections.deque = dataclasses.field(default_factory=collections.deque)
    fatal: list[str] = dataclasses.field(default_factory=list)

    @property
    def ended(self) -> bool:
        return self.clean_end or self.journal_stopped or self.dead

    @property
    def crashed(self) -> bool:
        return self.dead and not self.clean_end and not self.journal_stopped


def alive(host: str | None, pid: int | None) -> bool:
    """Whether the writer is still running: only answerable on its own host; elsewhere assumed alive."""
    if pid is None or host not in (None, socket.gethostname()):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def pid_of(value: Any) -> int | None:
    """A header's pid, where it can be one (a positive C int): the follower signals it to see if it lives."""
    return value if type(value) is int and 0 < value < 2**31 else None


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _fields(value: Any) -> dict:
    """A record's mapping field, or an empty one where the record holds something else there."""
    return value if isinstance(value, dict) else {}


def new_process(key: tuple[str, int], path: str, header: dict, window: int) -> ProcessState:
    """The process whose journal header `header` opens the file at `path`."""
    pid = pid_of(header.get("pid"))
    host = _text(header.get("host"))
    resource = _fields(header.get("resource"))
    label = f"{host}:{pid}" if host and pid is not None else os.path.basename(path)
    return ProcessState(
        key,
        label,
        host,
        pid,
        _text(resource.get("service.name")),
        requests=collections.deque(maxlen=window),
    )


def apply_record(process: ProcessState, record: dict, kind: Any) -> None:
    """A record (not a header) of the process's journal, of kind `kind`, applied to its state."""
    t = record.get("t") if type(record.get("t")) is int and 0 <= record["t"] < 2**63 else None
    if t is not None:
        process.first_record_ns = process.first_record_ns or t
        process.last_record_ns = t
    if kind == "sample" and isinstance(record.get("attrs"), dict):
        process.latest_sample = record["attrs"]
    elif kind == "start":
        _started_span(process, record)
    elif kind == "end":
        _ended_span(process, record)
    elif kind == "end_marker":
        process.clean_end = record.get("clean") is not False
    elif kind == "disk_full":
        process.journal_stopped = True


def _started_span(process: ProcessState, record: dict) -> None:
    span_id = record.get("span_id")
    if not isinstance(span_id, str):
        return
    if len(process.in_flight) >= MAX_IN_FLIGHT:
        process.in_flight_left_out += 1
        return
    attributes = _fields(record.get("attrs"))
    stage = attributes.get(sc.STAGE)
    t = record.get("t")
    process.in_flight[span_id] = LiveSpan(
        _text(record.get("name")) or "?",
        _text(stage),
        t if type(t) is int and 0 <= t < 2**63 else 0,
        _text(record.get("trace_id")) or "?",
    )


def _ended_span(process: ProcessState, record: dict) -> None:
    span_id = record.get("span_id")
    span = process.in_flight.pop(span_id, None) if isinstance(span_id, str) else None
    attributes = _fields(record.get("attrs"))
    stage = span.stage if span is not None else attributes.get(sc.STAGE)
    if stage != sc.STAGE_REQUEST:
        return
    process.requests_completed += 1
    memory = _fields(record.get("mem"))
    t = record.get("t")
    t = t if type(t) is int and 0 <= t < 2**63 else 0
    process.requests.append(RequestReading(t, {**process.latest_sample, **memory}))


def keep_fatal(process: ProcessState, line: bytes) -> None:
    """A line of a faulthandler report the process wrote as it died, up to MAX_FATAL_LINES."""
    if len(process.fatal) < MAX_FATAL_LINES:
        process.fatal.append(line.strip(b"\0")[:MAX_TEXT].decode("utf-8", "replace").rstrip())
