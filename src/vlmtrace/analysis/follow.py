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
at most START_BYTES before its end; processes are kept up to MAX_PROCESSES (the oldest ended ones are
forgotten first), and what each keeps is bounded by `follow_records.py`, which turns records into state.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import os
from typing import Any, BinaryIO

import orjson

from vlmtrace.analysis.follow_records import ProcessState, alive, apply_record, keep_fatal, new_process, pid_of
from vlmtrace.analysis.readers.compact_records import FullRecords
from vlmtrace.analysis.readers.files import end_before_zeros
from vlmtrace.analysis.readers.journal import BLANK, FATAL_PREFIXES, rotation_order

CHUNK = 64 * 1024
START_BYTES = 4 * 1024 * 1024
MAX_READ_BYTES = 16 * 1024 * 1024  # per file and poll: a poll stays short behind a burst of records
MAX_PROCESSES = 32
MAX_FATAL_BYTES = 256 * 1024
MAX_LINE_BYTES = 4 * 1024 * 1024  # a longer line is no journal record: skipped, never held
ZERO_TAIL_BYTES = 4 * 1024 * 1024  # zero bytes looked back over for a file's last record
MAX_EXTENTS = 4096  # stretches of stored data stepped through to find where a sparse file's data ends


@dataclasses.dataclass
class _File:
    path: str
    offset: int = 0
    process: ProcessState | None = None
    done: bool = False
    records: FullRecords = dataclasses.field(default_factory=FullRecords)  # format 3's, as format 2 writes them


def _data_end(handle: BinaryIO, size: int) -> int:
    """Where a file's written bytes end: before the zero bytes of a live writer's mapped window. A hole
    (a sparse file's unwritten stretch) is stepped over, not read; zero bytes on disk are looked at for
    at most ZERO_TAIL_BYTES (a writer's window is 1 MiB)."""
    end = _stored_end(handle.fileno(), size)
    written = end_before_zeros(handle.fileno(), end, ZERO_TAIL_BYTES)
    return max(0, end - ZERO_TAIL_BYTES) if written is None else written


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
            if not process.ended and not alive(process.host, process.pid):
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
                    keep_fatal(process, line)
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
            pid = pid_of(record.get("pid"))
            key = (rotation_order(state.path)[0], pid or 0)
            if key not in self.processes:
                self.processes[key] = new_process(key, state.path, record, self.window)
            state.process = self.processes[key]
            return
        if state.process is None:
            state.done = True  # a JSON-lines file that does not start with a journal header: not a journal
            return
        apply_record(state.process, record, kind)

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
                keep_fatal(process, line)
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
