"""Following a journal directory while its processes write it: read-only, incremental, bounded.

`vlmtrace top` polls a `JournalFollower`. Each poll opens each live file, reads from where the last poll
stopped up to the first zero byte (the unused rest of the writer's mapped window, docs/journal.md) or
the end of the file, takes the complete lines and closes the file again: the follower holds no
descriptor between polls (a rotated-away file it held open would keep its disk space) and never
writes, locks or maps anything, so the service pays nothing for it but page-cache reads.

Rotation: a process's next file (`….<seq+1>.jsonl`) appears in the directory; the old one is read to
its end (the writer cuts it after its last record) and dropped. A file deleted by the writer's
`max_files` is forgotten. A restarted service is a new process with files of its own; the old process,
if it has no end marker and its pid is gone (same host), ended without a clean end: a crash, whose
faulthandler text, written after the zero bytes, is read then.

Memory is bounded whatever the journal's size or age: at start each process's newest file is read from
at most START_BYTES before its end; spans in flight are kept up to MAX_IN_FLIGHT per process, request
readings up to the window, processes up to MAX_PROCESSES (the oldest ended ones are forgotten first).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import os
import socket
from typing import Any, BinaryIO

import orjson

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.compact_records import FullRecords
from vlmtrace.analysis.readers.journal import BLANK, FATAL_PREFIXES, rotation_order

CHUNK = 64 * 1024
START_BYTES = 4 * 1024 * 1024
MAX_READ_BYTES = 16 * 1024 * 1024  # per file and poll: a poll stays short behind a burst of records
MAX_IN_FLIGHT = 4096
MAX_PROCESSES = 32
MAX_FATAL_LINES = 200
MAX_FATAL_BYTES = 256 * 1024
MAX_LINE_BYTES = 4 * 1024 * 1024  # a longer line is no journal record: skipped, never held
MAX_TEXT = 1000  # characters kept of a name, a host or a fatal line
ZERO_TAIL_BYTES = 4 * 1024 * 1024  # zero bytes looked back over for a file's last record
MAX_EXTENTS = 4096  # stretches of stored data stepped through to find where a sparse file's data ends


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


@dataclasses.dataclass
class _File:
    path: str
    offset: int = 0
    process: ProcessState | None = None
    done: bool = False
    records: FullRecords = dataclasses.field(default_factory=FullRecords)  # format 3's, as format 2 writes them


def _alive(host: str | None, pid: int | None) -> bool:
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


def _pid(value: Any) -> int | None:
    """A header's pid, where it can be one (a positive C int): the follower signals it to see if it lives."""
    return value if type(value) is int and 0 < value < 2**31 else None


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _fields(value: Any) -> dict:
    """A record's mapping field, or an empty one where the record holds something else there."""
    return value if isinstance(value, dict) else {}


def _data_end(handle: BinaryIO, size: int) -> int:
    """Where a file's written bytes end: before the zero bytes of a live writer's mapped window. A hole
    (a sparse file's unwritten stretch) is stepped over, not read; zero bytes on disk are looked at for
    at most ZERO_TAIL_BYTES (a writer's window is 1 MiB)."""
    end = _stored_end(handle.fileno(), size)
    stop = max(0, end - ZERO_TAIL_BYTES)
    while end > stop:
        start = max(stop, end - CHUNK)
        handle.seek(start)
        written = handle.read(end - start).rstrip(b"\0")
        if written:
            return start + len(written)
        end = start
    return end


def _stored_end(descriptor: int, size: int) -> int:
    """Where the file's last stretch of stored data ends (its size where holes cannot be found)."""
    if not hasattr(os, "SEEK_HOLE"):
        return size
    position, end = 0, 0
    try:
        for _ in range(MAX_EXTENTS):
            position = os.lseek(descriptor, position, os.SEEK_DATA)
            end = position = os.lseek(descriptor, position, os.SEEK_HOLE)
    except OSError as error:
        return min(end, size) if error.errno == errno.ENXIO else size  # ENXIO: no data past `position`
    return size


class JournalFollower:
    """The state of every process writing into `target` (a journal directory or file), as of the last
    `poll()`; `window`: how many completed requests each process keeps the readings of."""

    def __init__(self, target: str, window: int = 100) -> None:
        self.target = target
        self.window = window
        self.files: dict[str, _File] = {}
        self.processes: dict[tuple[str, int], ProcessState] = {}
        self.unreadable_lines = 0
        self.running_forgotten = 0  # running processes forgotten past MAX_PROCESSES (the least recently active)
        self._started = False

    def poll(self) -> None:
        """Read what was written since the last poll."""
        paths = self._journal_files()
        if not self._started:
            self._start(paths)
        for path in paths:
            self.files.setdefault(path, _File(path))
        for path in [path for path in self.files if path not in paths]:
            del self.files[path]  # rotated away and deleted by the writer's max_files
        newest = {}
        for path in sorted(paths, key=rotation_order):
            newest[rotation_order(path)[0]] = path
        self._read_files(newest)
        while self._bury_the_dead():
            self._read_files(newest)  # past a dead run's zero bytes: a file target's next run, appended
        for state in self.files.values():
            # A directory target's file names carry their writer's pid: nobody writes into them again. A
            # file target (`PATH.jsonl`) is appended to by the next run, after a header of its own.
            process = state.process
            if process is not None and process.ended and f"-{process.pid}-" in os.path.basename(state.path):
                state.done = True
        self._forget_old_processes()

    def _read_files(self, newest: dict[str, str]) -> None:
        for path, state in sorted(self.files.items(), key=lambda item: rotation_order(item[0])):
            if not state.done:
                at_end = self._read(state)
                # An older file of a prefix whose next file exists is finished once read to its end.
                if at_end and newest.get(rotation_order(path)[0]) != path:
                    state.done = True

    def _bury_the_dead(self) -> bool:
        """Mark the processes found dead since the last poll, with what they wrote as they died; True if any."""
        found = False
        files_of = self._files_by_process()
        for process in list(self.processes.values()):
            if not process.ended and not _alive(process.host, process.pid):
                for state in files_of.get(id(process), ()):
                    self._read(state)  # what its fatal-signal handler wrote as it died
                process.dead = found = True
                self._read_fatal(files_of.get(id(process), []))
        return found

    def _files_by_process(self) -> dict[int, list[_File]]:
        """Each process's files (by the process's id()), in one pass over the files."""
        files_of: dict[int, list[_File]] = collections.defaultdict(list)
        for state in self.files.values():
            if state.process is not None:
                files_of[id(state.process)].append(state)
        return files_of

    def _journal_files(self) -> set[str]:
        try:
            if os.path.isfile(self.target):
                directory, name = os.path.split(self.target)
                stem = name.split(".jsonl")[0]
                candidates = [
                    os.path.join(directory or ".", entry)
                    for entry in os.listdir(directory or ".")
                    if entry.startswith(stem)
                ]
            elif os.path.isdir(self.target):
                candidates = [entry.path for entry in os.scandir(self.target)]
            else:
                return set()
        except OSError:  # removed or unreadable since the last poll: nothing to read now
            return set()
        return {
            path
            for path in candidates
            if ".jsonl" in os.path.basename(path) and not path.endswith(".gz") and os.path.isfile(path)
        }

    def _start(self, paths: set[str]) -> None:
        """Before the first poll: each process's files are read newest first back to START_BYTES in all
        (the file where the budget runs out from that point on, after its header, which names the
        process); older files are left unread."""
        self._started = True
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for path in sorted(paths, key=rotation_order):
            groups[rotation_order(path)[0]].append(path)
        for files in groups.values():
            budget = START_BYTES
            for path in reversed(files):
                state = self.files[path] = _File(path, done=budget <= 0)
                try:
                    size = os.path.getsize(path)
                    if budget <= 0 or size <= budget:
                        budget -= size
                        continue
                    with open(path, "rb") as handle:
                        self._lines(state, handle.readline(CHUNK))
                        after_header = handle.tell()
                        later = _data_end(handle, size) - budget
                        handle.seek(max(after_header, later))
                        if later > after_header:
                            handle.readline(MAX_LINE_BYTES)  # the rest of a line cut by the seek
                        state.offset = handle.tell()
                except OSError:  # deleted by its writer's rotation since it was listed
                    continue
                if state.process is not None:
                    state.process.started_mid_file = True
                budget = 0

    def _read(self, state: _File) -> bool:
        """Read the complete lines after `state.offset`; True when the file's end (not zero bytes) was met."""
        try:
            handle = open(state.path, "rb")  # noqa: SIM115 - closed below, whatever happens
        except OSError:
            return False
        try:
            handle.seek(state.offset)
            pending = b""
            budget = MAX_READ_BYTES
            while budget > 0:
                chunk = handle.read(CHUNK)
                if not chunk:
                    return True
                zero = chunk.find(b"\0")
                data = pending + (chunk if zero < 0 else chunk[:zero])
                if len(data) > MAX_LINE_BYTES and b"\n" not in data:
                    # No journal record is this long: the line is skipped up to its end, never held.
                    self.unreadable_lines += 1
                    state.offset += len(data)
                    data = b""
                    passed, found = self._skip_line(handle)
                    state.offset += passed
                    if not found:
                        return False
                cut = data.rfind(b"\n") + 1
                if cut:
                    self._lines(state, data[:cut])
                    state.offset += cut
                    if state.done:
                        return False
                pending = data[cut:]
                if zero >= 0:
                    return False
                budget -= len(chunk)
            return False
        finally:
            handle.close()

    @staticmethod
    def _skip_line(handle: Any) -> tuple[int, bool]:
        """Read past the rest of a line, up to MAX_READ_BYTES: the bytes passed (its newline included),
        and whether its end was found (if not, the next poll goes on from there)."""
        passed = 0
        while passed < MAX_READ_BYTES:
            chunk = handle.read(CHUNK)
            zero = chunk.find(b"\0")
            end = chunk.find(b"\n", 0, zero if zero >= 0 else len(chunk))
            if end >= 0:
                handle.seek(handle.tell() - len(chunk) + end + 1)
                return passed + end + 1, True
            if not chunk or zero >= 0:
                return passed + (zero if zero >= 0 else 0), False
            passed += len(chunk)
        return passed, False

    def _lines(self, state: _File, data: bytes) -> None:
        for line in data.splitlines():
            if not line.startswith(b"{"):
                process = state.process
                if process is not None and (process.fatal or line.strip(BLANK).startswith(FATAL_PREFIXES)):
                    self._keep_fatal(process, line)
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.unreadable_lines += 1
                continue
            if isinstance(record, dict) and (record := state.records.full(record)) is not None:
                self._record(state, record)
            if state.done:
                return

    def _record(self, state: _File, record: dict) -> None:
        kind = record.get("k")
        if kind == "header":
            state.process = self._process_of(state.path, record)
            return
        process = state.process
        if process is None:
            state.done = True  # a JSON-lines file that does not start with a journal header: not a journal
            return
        t = record.get("t") if type(record.get("t")) is int and 0 <= record["t"] < 2**63 else None
        if t is not None:
            process.first_record_ns = process.first_record_ns or t
            process.last_record_ns = t
        if kind == "sample" and isinstance(record.get("attrs"), dict):
            process.latest_sample = record["attrs"]
        elif kind == "start":
            self._started_span(process, record)
        elif kind == "end":
            self._ended_span(process, record)
        elif kind == "end_marker":
            process.clean_end = record.get("clean") is not False
        elif kind == "disk_full":
            process.journal_stopped = True

    def _process_of(self, path: str, header: dict) -> ProcessState:
        pid = _pid(header.get("pid"))
        key = (rotation_order(path)[0], pid or 0)
        process = self.processes.get(key)
        if process is None:
            host = _text(header.get("host"))
            resource = _fields(header.get("resource"))
            label = f"{host}:{pid}" if host and pid is not None else os.path.basename(path)
            process = ProcessState(
                key,
                label,
                host,
                pid,
                _text(resource.get("service.name")),
                requests=collections.deque(maxlen=self.window),
            )
            self.processes[key] = process
        return process

    @staticmethod
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

    @staticmethod
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

    def _keep_fatal(self, process: ProcessState, line: bytes) -> None:
        if len(process.fatal) < MAX_FATAL_LINES:
            process.fatal.append(line.strip(b"\0")[:MAX_TEXT].decode("utf-8", "replace").rstrip())

    def _read_fatal(self, files: list[_File]) -> None:
        """faulthandler's text after the zero bytes of a dead process's last file (docs/journal.md); the
        file's offset then moves past both, to where a restarted run appending to a file target begins."""
        if not files or files[0].process is None:
            return
        process = files[0].process
        last = max(files, key=lambda state: rotation_order(state.path))
        wanted = START_BYTES + MAX_FATAL_BYTES  # the rest of a mapped window (1 MiB), then the report
        try:
            with open(last.path, "rb") as handle:
                handle.seek(last.offset)
                text = handle.read(wanted)
        except OSError:
            return
        position = len(text) - len(text.lstrip(BLANK))
        for line in text[position:].splitlines(keepends=True):
            if line.startswith(b"{") or (not line.endswith(b"\n") and len(text) == wanted):
                break  # the next run's header, or a line cut by the read
            if process.fatal or line.strip(BLANK).startswith(FATAL_PREFIXES):
                self._keep_fatal(process, line)
            position += len(line)
        last.offset += position

    def _forget_old_processes(self) -> None:
        """Past MAX_PROCESSES, the processes that ended longest ago are forgotten first, then the running
        ones whose last record is oldest (counted); their files are no longer read."""
        if len(self.processes) <= MAX_PROCESSES:
            return
        by_age = sorted(self.processes.values(), key=lambda p: (not p.ended, p.last_record_ns or 0))
        gone = {id(process): process for process in by_age[: len(self.processes) - MAX_PROCESSES]}
        for process in gone.values():
            del self.processes[process.key]
            self.running_forgotten += not process.ended
        for state in self.files.values():
            if id(state.process) in gone:
                state.process, state.done = None, True
