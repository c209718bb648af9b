"""Reader for the vlmtrace journal (docs/journal.md), including one cut short by a crash.

A journal may end in a truncated record, zero bytes (the unused rest of the writer's mapped window)
and a faulthandler text block; rotated files (`.0.jsonl`,
`.1.jsonl`, …) each start with a header; several processes write their own files into one
directory. Spans with a start record and no end record were in flight when the process stopped.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Iterable
from typing import IO, Any

import orjson

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers import budget, compact_records, crash_cut, journal_processes, typed
from vlmtrace.analysis.readers.captures import add_capture
from vlmtrace.analysis.readers.depth import text
from vlmtrace.analysis.readers.strays import Strays
from vlmtrace.analysis.step1_loading.column_keys import JOURNAL_HEAD_KEYS
from vlmtrace.analysis.trace_data import TraceData

Progress = Callable[[int], None]

# How faulthandler's report lines begin (CPython 3.10–3.14); a run of such lines is one fatal block.
FATAL_PREFIXES = (
    b"Fatal Python error",
    b"Thread 0x",
    b"Current thread 0x",
    b"Current thread's C stack",
    b"Stack (most recent call first)",
    b"Windows fatal exception",
    b"Extension modules:",
)
# Whitespace, and the zero bytes a writer's mapped tail leaves after its last record when it dies.
BLANK = b" \t\r\n\x00"
JOURNAL_KINDS = frozenset(
    {"header", "start", "end", "sample", "dropped", "warning", "end_marker", "disk_full", "capture"}
)
_ROTATED_NAME = re.compile(
    r"^(?P<prefix>.*?)\.(?P<seq>\d+)\.jsonl(?:\.gz)?$|^(?P<prefix2>.*?\.jsonl)(?:\.(?P<seq2>\d+))?(?:\.gz)?$"
)
PROGRESS_EVERY_LINES = 32768
# What of a faulthandler block is kept (a real one is a few hundred lines), and of `warning` records
# per file: the rest is counted, so a hostile file cannot make the report as large as itself.
FATAL_LINES_KEPT = 2000
FATAL_LINE_CHARS = 1000
WARNINGS_KEPT = 1000
WARNING_CHARS = 1000  # of a warning record's message
WARNING_SOURCE_CHARS = 200
# Start records kept per process while their span has not ended (a service has a few thousand spans in
# flight at most): each is held until its end and becomes an in-flight span if none comes.
MAX_WAITING = 20_000
# The thread of an ended span is on its start record, kept as raw bytes until the end arrives: a search
# for one field costs far less than decoding the record again.
THREAD = re.compile(rb'"thread":"((?:[^"\\]|\\.)*)"')


def thread_of(start_record: bytes | None) -> str | None:
    """The thread named in a start record kept unparsed, its JSON string decoded."""
    found = THREAD.search(start_record) if start_record else None
    if found is None:
        return None
    try:
        return orjson.loads(b'"' + found.group(1) + b'"')
    except orjson.JSONDecodeError:
        return found.group(1).decode("utf-8", "replace")


def ended_by(end_marker: dict) -> str | None:
    """How the process ended, from its end record: a signal's name ("SIGTERM"), "uncaught NAME", or None."""
    value = end_marker.get("ended_by")
    return value[:80] if isinstance(value, str) else None


def rotation_order(path: str) -> tuple[str, int, str]:
    """Sort key that keeps a process's rotated files in sequence (`x.0.jsonl` before `x.1.jsonl`)."""
    name = os.path.basename(path)
    match = _ROTATED_NAME.match(name)
    if match is None:
        return (path, 0, name)
    prefix = match.group("prefix") or match.group("prefix2") or name
    seq = match.group("seq") or match.group("seq2") or "0"
    return (os.path.join(os.path.dirname(path), prefix), int(seq), name)


def looks_like_journal(first_record: Any) -> bool:
    return isinstance(first_record, dict) and type(first_record.get("k")) is str and first_record["k"] in JOURNAL_KINDS


class JournalReader:
    """Reads journal files into a TraceData; keeps per-process state across rotated files.

    Start records are kept as raw lines until their span ends; the few that never end are parsed
    in `finish()` into in-flight spans.
    """

    def __init__(self, data: TraceData) -> None:
        self.data = data
        self.pending: dict[int, dict[str, bytes]] = {}  # process → span id → its start record, unparsed
        self.declared: dict[int, compact_records.Declared | None] = {}  # process → its format 3 header's keys
        self.starts_let_go = 0  # of this file: the oldest waiting starts, past MAX_WAITING in one process

    def wait_for_end(self, pending: dict[str, bytes], span_id: str, line: bytes) -> None:
        """Keep a start record until its span's end; past MAX_WAITING the oldest waiting one is let go."""
        if len(pending) >= MAX_WAITING and span_id not in pending:
            del pending[next(iter(pending))]
            self.starts_let_go += 1
        pending[span_id] = line

    def note_let_go(self, source: str) -> None:
        """The start records let go while reading `source`, as one note."""
        if self.starts_let_go:
            self.data.problem(
                source,
                None,
                f"{self.starts_let_go:,} start records let go unended: more than {MAX_WAITING:,} spans "
                "of one process were waiting for their end (their end, if it comes, has no thread)",
                "note",
            )
            self.starts_let_go = 0

    def read_file(
        self,
        source: str,
        stream: IO[bytes],
        position: Callable[[], int],
        progress: Progress | None,
    ) -> None:
        """Read one journal file."""
        data = self.data
        spans, samples, devices = data.spans, data.samples, data.devices
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        append_span, head_of, devices_key = spans.append_head, operator.itemgetter(*JOURNAL_HEAD_KEYS), sc.MEM_DEVICES
        process: int | None = None
        pending: dict[str, bytes] = {}
        linked = compact_records.LinkedStarts()  # format 3's links written as a span id
        keys: compact_records.Declared | None = None  # format 3's reading keys and names; None before format 3
        last_t = None
        suspect: tuple[int, bytes] | None = None
        fatal_start = 0
        fatal_lines: list[str] = []
        headers_seen: set[int] = set()
        ended: set[str] = set()  # span ids of this file's end records: a repeated one is counted once
        repeated = 0
        fatal_cut = 0
        warnings_before = len(data.warnings)
        refused_version = False
        lineno = 0
        countdown = PROGRESS_EVERY_LINES
        spending, checked = budget.current(), typed.checked_attributes
        strays = Strays(data, source, "records of no journal kind")
        try:
            for lineno, line in enumerate(spending.lines(stream), start=1):
                countdown -= 1
                if not countdown:
                    countdown = PROGRESS_EVERY_LINES
                    if progress is not None:
                        progress(position())
                try:
                    record = loads(line)
                except decode_error:
                    stripped = line.strip(BLANK)
                    if fatal_lines or stripped.startswith(FATAL_PREFIXES):
                        if not fatal_lines:
                            fatal_start = lineno
                            if suspect is not None:
                                crash_cut.cut_short(data, source, suspect)
                                suspect = None
                        if len(fatal_lines) < FATAL_LINES_KEPT:
                            fatal_lines.append(
                                line.strip(b"\0")[:FATAL_LINE_CHARS].decode("utf-8", "replace").rstrip("\n")
                            )
                        else:
                            fatal_cut += 1
                    elif stripped:
                        if suspect is not None:
                            crash_cut.corrupt(data, source, suspect)
                        suspect = (lineno, line)
                    if b"\0" in line:
                        ended.clear()  # the writer died here; what follows is a restarted writer's run
                        if suspect is not None:
                            # Zero bytes: whatever came just before was cut by the writer's death.
                            crash_cut.cut_short(data, source, suspect)
                            suspect = None
                    continue
                if fatal_lines:
                    if process is None:
                        process, pending = self._headless(source, fatal_start)
                    crash_cut.fatal_block(data, process, source, fatal_start, fatal_lines, fatal_cut)
                    fatal_lines, fatal_cut = [], 0
                if suspect is not None:
                    crash_cut.corrupt(data, source, suspect)
                    suspect = None
                if type(record) is not dict:
                    if strays.add(lineno):
                        data.problem(source, lineno, "not a journal record (expected a JSON object)")
                    continue
                kind = record.get("k")
                if kind == "header":
                    refused_version = not self.known_version(record, source, lineno)
                    ended.clear()  # a header starts a writer's run: span ids are unique within one
                    linked.clear()
                    if not refused_version:
                        process, pending = self.header(record, source, lineno, headers_seen)
                        keys = self.declared[process]
                        spending.check()  # a new process: the bound on processes holds exactly
                    continue
                if refused_version:
                    continue
                if process is None:
                    process, pending = self._headless(source, lineno)
                    keys = self.declared.get(process)
                if kind == "end":
                    started = None
                    if keys is not None:
                        span_id = record.get("span_id")
                        started = pending.pop(span_id, None) if type(span_id) is str and pending else None
                        record = compact_records.end_fields(record, started, keys)
                        if record is None:
                            if type(span_id) is str and span_id in ended:
                                repeated += 1
                            else:
                                spending.skipped_record(f"line {lineno}", "an end whose start is not in its journal")
                            continue
                    try:
                        head = head_of(record)
                    except KeyError:
                        head = tuple(map(record.get, JOURNAL_HEAD_KEYS))
                    wrong = typed.wrong_head(*head[:4])
                    if wrong is not None:
                        spending.skipped_record(f"line {lineno}", wrong)
                        continue
                    if head[1] in ended:
                        repeated += 1
                        continue
                    ended.add(head[1])
                    attributes = record.get("attrs")
                    if type(attributes) is not dict:
                        attributes = {}
                    memory = record.get("mem")
                    if type(memory) is dict:
                        attributes = _with_memory(attributes, record.get("mem0"), memory)
                    attributes = checked(attributes)
                    if started is None and pending:
                        started = pending.pop(head[1], None)
                    thread = thread_of(started) if started is not None else None
                    if thread is not None:
                        attributes[sc.THREAD_NAME] = thread
                    append_span(process, head, attributes)
                    last_t = head[6]
                    if devices_key in attributes:
                        devices.append(process, last_t, attributes)
                elif kind == "start":
                    span_id = record.get("span_id")
                    if isinstance(span_id, str):
                        self.wait_for_end(
                            pending, span_id, linked.start_line(record, line) if keys is not None else line
                        )
                    last_t = record.get("t")
                elif kind == "sample":
                    attributes = record.get("attrs")
                    if keys is not None and "mem" in record:
                        attributes = compact_records.memory(record["mem"], keys.mem, record.get("t"))
                    attributes = checked(attributes) if type(attributes) is dict else {}
                    last_t = record.get("t")
                    samples.append(process, last_t, attributes)
                    if devices_key in attributes:
                        devices.append(process, last_t, attributes)
                elif kind == "end_marker":
                    data.processes[process].clean_end = True
                    data.processes[process].ended_by = ended_by(record)
                    last_t = record.get("t")
                elif not self.note(record, kind, process, source, lineno) and strays.add(lineno):
                    data.problem(source, lineno, f"unknown journal record kind {text(kind, 40)!r}", "note")
        except (EOFError, OSError) as error:
            if process is not None:
                # Its end was not read, so nothing is known about how the process ended: not a crash.
                data.processes[process].end_unread = True
                pending.clear()
            if isinstance(error, budget.InputTooLarge):
                raise  # the input's reader names the bound that stopped it
            data.problem(source, lineno + 1, f"file cannot be read to its end ({error}); earlier lines were kept")
        strays.finish()
        if suspect is not None:
            crash_cut.cut_short(data, source, suspect)
        if fatal_lines:
            if process is None:
                process, pending = self._headless(source, fatal_start)
            crash_cut.fatal_block(data, process, source, fatal_start, fatal_lines, fatal_cut)
        self.note_let_go(source)
        if repeated:
            data.problem(
                source,
                None,
                f"{repeated:,} end record{'s' if repeated != 1 else ''} repeating a span id already "
                "ended in this file; each span was counted once",
                "note",
            )
        if len(data.warnings) - warnings_before > WARNINGS_KEPT:
            cut = len(data.warnings) - warnings_before - WARNINGS_KEPT
            del data.warnings[warnings_before + WARNINGS_KEPT :]
            data.warnings.append(
                {"source": "vlmtrace", "t": None, "message": f"{cut:,} more warning records of {source} not kept"}
            )
        if isinstance(last_t, int) and process is not None:
            info = data.processes[process]
            info.last_record_ns = max(info.last_record_ns or last_t, last_t)

    def note(self, record: dict, kind: Any, process: int, source: str, lineno: int) -> bool:
        """A record of the few that say something about the journal itself (dropped, warning,
        disk_full) or hold a capture window's allocation sites, not about spans; False for another kind."""
        data = self.data
        if kind == "dropped":
            for key in ("otlp_spans", "journal_records"):
                value = record.get(key)
                if isinstance(value, int):
                    data.dropped[key] = max(data.dropped.get(key, 0), value)
        elif kind == "disk_full":
            # The writer stopped on a full file system, cleanly: what follows (or its absence) says
            # nothing about a crash, and the `dropped` record counts what was not written.
            data.processes[process].clean_end = True
            data.warnings.append(
                {
                    "source": "journal",
                    "t": record.get("t"),
                    "message": (
                        "the journal stopped early: its file system was full; later records were counted, not written"
                    ),
                }
            )
        elif kind == "capture":
            add_capture(data, record, process, source, lineno)
        elif kind == "warning":
            data.warnings.append(
                {
                    "source": text(record.get("source"), WARNING_SOURCE_CHARS),
                    "message": text(record.get("message"), WARNING_CHARS),
                    "t": record.get("t"),
                }
            )
        else:
            return False
        return True

    def known_version(self, header: dict, source: str, lineno: int) -> bool:
        """Whether the header's format version is one this reader knows (journal_processes.py)."""
        return journal_processes.known_version(self.data, header, source, lineno)

    def header(self, record: dict, source: str, lineno: int, headers_seen: set[int]) -> tuple[int, dict]:
        """A header: the process whose records follow, and its starts still waiting for their end."""
        process = journal_processes.of_header(self.data, record, source, lineno, headers_seen)
        self.declared[process] = compact_records.declared(record)
        return process, self.pending.setdefault(process, {})

    def _headless(self, source: str, lineno: int) -> tuple[int, dict]:
        """Records before any header: the process the file's name says (journal_processes.py)."""
        process = journal_processes.of_headless_file(self.data, source, lineno)
        return process, self.pending.setdefault(process, {})

    def finish(self) -> None:
        """Turn spans that started and never ended into in-flight records."""
        for process, pending in self.pending.items():
            crash_cut.in_flight(self.data, process, pending.values(), self.declared.get(process))
        self.pending.clear()


def _with_memory(attributes: dict, start_memory: Any, end_memory: dict) -> dict:
    """An end record's attributes with its memory readings merged in (since journal format 2 the
    recorder writes them apart: `mem` at end, `mem0` at start where that reading was another)."""
    start = end_memory if start_memory is None else start_memory if type(start_memory) is dict else {}
    return {**sc.span_memory_attributes(start, end_memory), **attributes}


def read_journal(paths: Iterable[str | os.PathLike], progress: Callable[[int, int], None] | None = None) -> TraceData:
    """Read journal files or directories of them (rotated files in sequence, one process per writer).

    What could not be read is listed, with file and line, in `TraceData.problems`; spans that started
    and never ended are in `TraceData.in_flight`. `progress(bytes_done, bytes_total)` is called as it goes.
    """
    from vlmtrace.analysis.readers.detect import read_inputs  # detect dispatches to this module: import late

    return read_inputs([os.fspath(path) for path in paths], progress=progress)
