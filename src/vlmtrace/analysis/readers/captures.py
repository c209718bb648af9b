"""`capture` records (docs/journal.md): the allocation sites a capture window kept, read as untrusted input.

Every field is checked for its type and bound: at most MAX_SITES sites per record, STACK_FRAMES frames
per stack and TEXT_CHARS characters per text are kept, byte counts are integers between 0 and 2**63,
and a file holds at most MAX_CAPTURES records that are read (the rest are counted, as a note). A record
that is not one is a problem named by its line, and the rest of the file is read on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlmtrace.analysis.registry import BY_NAME
from vlmtrace.analysis.trace_data import TraceData

MAX_CAPTURES = 100  # per file: one window per component per hour is a few dozen a day
MAX_SITES = 20
STACK_FRAMES = 6
TEXT_CHARS = 300
INT64_MAX = 2**63 - 1


@dataclasses.dataclass
class Capture:
    process: int
    source: str
    line: int
    start_ns: int | None
    end_ns: int | None
    components: list[str]
    tool: str
    reason: str
    requests: int
    stopped_by: str
    snapshot: str | None
    sites: list[dict]
    sites_left_out: int
    bytes_left_out: int


def latest_window(captures: list[Capture], component: str) -> Capture | None:
    """Of one process's capture windows, the latest that covered `component` (None where none did)."""
    mine = [capture for capture in captures if component in capture.components]
    return max(mine, key=lambda item: (item.end_ns or 0, item.line)) if mine else None


def _text(value: Any) -> str | None:
    return value[:TEXT_CHARS] if isinstance(value, str) else None


def _word(value: Any) -> str:
    """A short name field (tool, reason, stopped_by, function): "?" where it is not text."""
    return value[:TEXT_CHARS] if isinstance(value, str) else "?"


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= INT64_MAX else None


def _time(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= INT64_MAX else None


def _site(value: Any, requests: int) -> dict | None:
    if type(value) is not dict:
        return None
    file, line, size = _text(value.get("file")), _count(value.get("line")), _count(value.get("bytes"))
    if file is None or line is None or size is None:
        return None
    stack = value.get("stack")
    stage = value.get("stage")
    return {
        "file": file,
        "line": line,
        "function": _word(value.get("function")),
        "stage": stage[:80] if isinstance(stage, str) else None,
        "stack": [frame[:TEXT_CHARS] for frame in stack[:STACK_FRAMES] if isinstance(frame, str)]
        if type(stack) is list
        else [],
        "count": _count(value.get("count")) or 0,
        "bytes": size,
        "bytes_per_request": size / requests if requests else None,
    }


def add_capture(data: TraceData, record: dict, process: int, source: str, lineno: int) -> None:
    """One `capture` record of `process`, checked; a problem where it is not one."""
    kept = sum(1 for capture in data.captures if capture.source == source)
    if kept >= MAX_CAPTURES:
        if kept == MAX_CAPTURES:
            data.problem(
                source,
                lineno,
                f"more than {MAX_CAPTURES} capture records in this file; the later ones are not read",
                "note",
            )
            data.captures.append(Capture(process, source, lineno, None, None, [], "", "", 0, "", None, [], 0, 0))
        return
    components = record.get("components")
    components = (
        [name for name in components[: len(BY_NAME)] if isinstance(name, str) and name in BY_NAME]
        if type(components) is list
        else []
    )
    requests = _count(record.get("requests"))
    sites = record.get("sites")
    if not components or requests is None or type(sites) is not list:
        data.problem(source, lineno, "a capture record without its components, requests or sites; skipped")
        return
    read = [_site(site, requests) for site in sites[:MAX_SITES]]
    good = [site for site in read if site is not None]
    if len(good) < len(read):
        data.problem(
            source,
            lineno,
            f"{len(read) - len(good)} allocation site(s) of a capture record without file, line or bytes; skipped",
        )
    data.captures.append(
        Capture(
            process=process,
            source=source,
            line=lineno,
            start_ns=_time(record.get("start")),
            end_ns=_time(record.get("t")),
            components=components,
            tool=_word(record.get("tool")),
            reason=_word(record.get("reason")),
            requests=requests,
            stopped_by=_word(record.get("stopped_by")),
            snapshot=_text(record.get("snapshot")),
            sites=sorted(good, key=lambda site: -site["bytes"]),
            sites_left_out=(_count(record.get("sites_left_out")) or 0) + max(0, len(sites) - MAX_SITES),
            bytes_left_out=_count(record.get("bytes_left_out")) or 0,
        )
    )
