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
from vlmtrace.analysis.readers import budget, typed
from vlmtrace.analysis.readers.captures import add_capture
from vlmtrace.analysis.readers.depth import MAX_DEPTH, text, within_depth
from vlmtrace.analysis.readers.strays import Strays
from vlmtrace.analysis.step1_loading.column_keys import JOURNAL_HEAD_KEYS
from vlmtrace.analysis.trace_data import FatalBlock, InFlightSpan, TraceData

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
WRITER_FILE_NAME = re.compile(r"^vlmtrace-(?P<host>.+)-(?P<pid>\d{1,10})-\d+\.\d+\.jsonl$")
_ROTATED_NAME = re.compile(
    r"^(?P<prefix>.*?)\.(?P<seq>\d+)\.jsonl(?:\.gz)?$|^(?P<prefix2>.*?\.jsonl)(?:\.(?P<seq2>\d+))?(?:\.gz)?$"
)
PROGRESS_EVERY_LINES = 32768
# The journal format versions this reader knows (docs/journal.md); a header of another is refused.
KNOWN_VERSIONS = (1, 2)
# What of a faulthandler block is kept (a real one is a few hundred lines), and of `warning` records
# per file: the rest is counted, so a hostile file cannot make the report as large as itself.
FATAL_LINES_KEPT = 2000
FATAL_LINE_CHARS = 1000
FATAL_BLOCKS_KEPT = 20
WARNINGS_KEPT = 1000
WARNING_CHARS = 1000  # of a warning record's message
WARNING_SOURCE_CHARS = 200
SPAN_TEXT_CHARS = 1000  # of an in-flight span's name, ids, kind and thread
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


def process_label(header: dict, fallback: str) -> str:
    host, pid = header.get("host"), header.get("pid")
    pid = pid if type(pid) is int else None
    if isinstance(host, str) and pid is not None:
        return f"{host[:200]}:{pid}"
    if pid is not None:
        return f"pid {pid}"
    return fallback


class JournalReader:
    """Reads journal files into a TraceData; keeps per-process state across rotated files.

    Start records are kept as raw lines until their span ends; the few that never end are parsed
    in `finish()` into in-flight spans.
    """

    def __init__(self, data: TraceData) -> None:
        self.data = data
        self.pending: dict[int, dict[str, bytes]] = {}  # process → span id → its start record, unparsed
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
                                self._cut_short(source, suspect)
                                suspect = None
                        if len(fatal_lines) < FATAL_LINES_KEPT:
                            fatal_lines.append(
                                line.strip(b"\0")[:FATAL_LINE_CHARS].decode("utf-8", "replace").rstrip("\n")
                            )
                        else:
                            fatal_cut += 1
                    elif stripped:
                        if suspect is not None:
                            self._corrupt(source, suspect)
                        suspect = (lineno, line)
                    if b"\0" in line:
                        ended.clear()  # the writer died here; what follows is a restarted writer's run
                        if suspect is not None:
                            # Zero bytes: whatever came just before was cut by the writer's death.
                            self._cut_short(source, suspect)
                            suspect = None
                    continue
                if fatal_lines:
                    if process is None:
                        process, pending = self._headless(source, fatal_start)
                    self._fatal(process, source, fatal_start, fatal_lines, fatal_cut)
                    fatal_lines, fatal_cut = [], 0
                if suspect is not None:
                    self._corrupt(source, suspect)
                    suspect = None
                if type(record) is not dict:
                    if strays.add(lineno):
                        data.problem(source, lineno, "not a journal record (expected a JSON object)")
                    continue
                kind = record.get("k")
                if kind == "header":
                    refused_version = not self.known_version(record, source, lineno)
                    ended.clear()  # a header starts a writer's run: span ids are unique within one
                    if not refused_version:
                        process, pending = self.header(record, source, lineno, headers_seen)
                        spending.check()  # a new process: the bound on processes holds exactly
                    continue
                if refused_version:
                    continue
                if process is None:
                    process, pending = self._headless(source, lineno)
                if kind == "end":
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
                    if pending:
                        started = pending.pop(head[1], None)
                        thread = thread_of(started)
                        if thread is not None:
                            attributes[sc.THREAD_NAME] = thread
                    append_span(process, head, attributes)
                    last_t = head[6]
                    if devices_key in attributes:
                        devices.append(process, last_t, attributes)
                elif kind == "start":
                    span_id = record.get("span_id")
                    if isinstance(span_id, str):
                        self.wait_for_end(pending, span_id, line)
                    last_t = record.get("t")
                elif kind == "sample":
                    attributes = record.get("attrs")
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
            self._cut_short(source, suspect)
        if fatal_lines:
            if process is None:
                process, pending = self._headless(source, fatal_start)
            self._fatal(process, source, fatal_start, fatal_lines, fatal_cut)
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
        """Whether the header's format version is one this reader knows (a header without one is an
        early writer's); the records under another are skipped, and the report names the version."""
        version = header.get("v")
        if version is None or (type(version) is int and version in KNOWN_VERSIONS):
            return True
        shown = text(version, 40)
        self.data.problem(
            source,
            lineno,
            f"journal format version {shown} is not one this vlmtrace reads "
            f"({', '.join(map(str, KNOWN_VERSIONS))}); its records were skipped",
        )
        return False

    def header(self, record: dict, source: str, lineno: int, headers_seen: set[int]) -> tuple[int, dict]:
        """A header: the process whose records follow, and its starts still waiting for their end."""
        data = self.data
        resource = _kept(record, "resource", dict, source) or {}
        label = process_label(record, os.path.basename(source))
        host, pid, service = record.get("host"), record.get("pid"), resource.get("service.name")
        process = data.process(
            label,
            host=host if isinstance(host, str) else None,
            pid=pid if type(pid) is int and 0 <= pid < 2**63 else None,
            service=service if isinstance(service, str) else None,
            resource=resource,
            versions=_kept(record, "versions", dict, source),
            argv=_kept(record, "argv", list, source),
            from_journal=True,
        )
        info = data.processes[process]
        if source not in info.sources:
            info.sources.append(source)
        if headers_seen and process not in headers_seen:
            data.problem(
                source,
                lineno,
                f"records of another process ({label}) are interleaved in this file; "
                "records after this header are attributed to it",
                "note",
            )
        headers_seen.add(process)
        return process, self.pending.setdefault(process, {})

    def _headless(self, source: str, lineno: int) -> tuple[int, dict]:
        """A file whose header is missing or unreadable (cut, overwritten, deleted by rotation): its process
        is the one its name says (`vlmtrace-HOST-PID-START.N.jsonl`, as the writer names files), else named
        after the file; the report says which."""
        named = WRITER_FILE_NAME.match(os.path.basename(source))
        if named is None:
            self.data.problem(source, lineno, "journal records before any header; process named after the file", "note")
            process = self.data.process(os.path.basename(source), sources=[source], from_journal=True)
        else:
            host, pid = named["host"], int(named["pid"])
            self.data.problem(
                source,
                lineno,
                f"journal records before any header; process taken from the file name (host {host}, pid {pid})",
                "note",
            )
            process = self.data.process(f"{host}:{pid}", host=host, pid=pid, sources=[source], from_journal=True)
            info = self.data.processes[process]
            if source not in info.sources:
                info.sources.append(source)
        return process, self.pending.setdefault(process, {})

    def _cut_short(self, source: str, suspect: tuple[int, bytes]) -> None:
        """A bad line just before a fatal report or the end of the file: a record cut by the crash."""
        if suspect[1].lstrip().startswith(b"{"):
            self.data.problem(
                source, suspect[0], "truncated last record (the process stopped while writing it); skipped", "note"
            )
        else:
            self._corrupt(source, suspect)

    def _corrupt(self, source: str, suspect: tuple[int, bytes]) -> None:
        preview = suspect[1][:60].decode("utf-8", "replace").strip()
        self.data.problem(source, suspect[0], f"not valid JSON and not a faulthandler report: {preview!r}")

    def _fatal(self, process: int, source: str, line: int, lines: list[str], cut: int) -> None:
        kept = sum(1 for block in self.data.fatal if block.source == source)
        if kept >= FATAL_BLOCKS_KEPT:
            if kept == FATAL_BLOCKS_KEPT:
                self.data.problem(
                    source,
                    line,
                    f"more than {FATAL_BLOCKS_KEPT} faulthandler reports in this file; the later ones are not kept",
                    "note",
                )
                self.data.fatal.append(FatalBlock(process, source, line, "… later faulthandler reports not kept"))
            return
        text = "\n".join(lines).strip("\n")
        if cut:
            text += f"\n… {cut:,} more lines not kept"
            self.data.problem(
                source,
                line,
                f"a faulthandler report of {len(lines) + cut:,} lines: the first {len(lines):,} "
                f"were kept, {cut:,} more lines not kept",
                "note",
            )
        self.data.fatal.append(FatalBlock(process, source, line, text))

    def finish(self) -> None:
        """Turn spans that started and never ended into in-flight records (their values cut at the depth
        bound, the cuts named per process)."""
        for process, pending in self.pending.items():
            cut = 0
            for line in pending.values():
                record = orjson.loads(line)
                attributes = record.get("attrs") if isinstance(record.get("attrs"), dict) else {}
                if isinstance(record.get("mem"), dict):
                    attributes = {**record["mem"], **attributes}
                attributes, attributes_cut = within_depth(typed.checked_attributes(attributes))
                links, links_cut = within_depth(
                    [link for link in record.get("links") or () if isinstance(link, dict)]
                    if isinstance(record.get("links"), list)
                    else []
                )
                cut += attributes_cut + links_cut
                start = record.get("t")
                self.data.in_flight.append(
                    InFlightSpan(
                        process=process,
                        name=text(record.get("name"), SPAN_TEXT_CHARS),
                        trace_id=text(record.get("trace_id"), SPAN_TEXT_CHARS),
                        span_id=text(record.get("span_id"), SPAN_TEXT_CHARS),
                        parent_id=record.get("parent_id") if isinstance(record.get("parent_id"), str) else None,
                        start_ns=start if type(start) is int and 0 <= start < 2**63 else None,
                        kind=text(record.get("kind"), SPAN_TEXT_CHARS) if record.get("kind") is not None else None,
                        thread=text(record.get("thread"), SPAN_TEXT_CHARS)
                        if record.get("thread") is not None
                        else None,
                        attributes=attributes,
                        links=links,
                    )
                )
            if cut:
                label = self.data.processes[process].label
                self.data.problem(
                    label,
                    None,
                    f"{cut:,} part{'s' if cut != 1 else ''} of in-flight spans' attributes or links "
                    f"nested deeper than {MAX_DEPTH} levels cut there",
                )
        self.pending.clear()


def _kept(header: dict, key: str, kind: type, source: str) -> Any:
    """A header's `key` where it is a `kind`, cut at the depth bound (the cuts counted on the budget); else None."""
    value = header.get(key)
    if not isinstance(value, kind):
        return None
    value, cut = within_depth(value)
    budget.current().cut_deep(f"the header's {key!r} of {source}", cut)
    return value


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
