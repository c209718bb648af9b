"""The crash-safe journal: every record is in the kernel's page cache as soon as it is written.

The format is specified in docs/journal.md. Records are copied into a shared memory mapping of the
file's tail (`_MappedTail`): the pages belong to the kernel, so a process killed by SIGKILL or
`std::terminate` loses at most the record being copied, exactly as with `write(2)` — but appending
makes no system call. That matters on the request path: a system call releases the GIL, and taking
it back can wait a whole switch interval behind a busy thread (measured inside a TurboMind pipeline
on an H200 host: ~20 µs per `os.write` instead of ~3). A fatal signal appends Python's own stack
report (faulthandler) to the end of the file, after the zero bytes of the mapped tail not yet used.
Where the file cannot be mapped, records go through one `os.write` each.
"""

from __future__ import annotations

import collections
import faulthandler
import itertools
import logging
import mmap
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import orjson

from vlmtrace import semconv
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind, StatusCode

from vlmtrace.export import fatal_signals, sdk_compat
from vlmtrace.export.fork import after_fork_in_child

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, a file target is then shared by whoever names it
    fcntl = None

_log = logging.getLogger("vlmtrace")

FORMAT_VERSION = 2
_FILE_TARGET = re.compile(r"^(?P<base>.*\.jsonl)(?:\.(?P<seq>\d+))?$")
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_DROPPED_INTERVAL_NS = 1_000_000_000
_MAX_DISTINCT_WARNINGS = 256
_MAX_LOCKED_SKIPS = 64

_KIND_NAMES = {kind: kind.name for kind in SpanKind}
_STATUS_NAMES = {code: code.name for code in StatusCode}

# faulthandler reports to one file per process; these name the journal that holds it.
_faulthandler_lock = threading.Lock()
_faulthandler_holder: JournalWriter | None = None


def _dumps(record: Mapping[str, Any]) -> bytes:
    """One `\\n`-terminated JSON line; values orjson cannot encode (ints past 64 bits, odd types) become strings."""
    try:
        return orjson.dumps(record, default=str, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return orjson.dumps(_stringify_unencodable(record), default=str, option=orjson.OPT_APPEND_NEWLINE)


def _stringify_unencodable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _stringify_unencodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stringify_unencodable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    return value


def _links(span: ReadableSpan) -> list[dict[str, str]] | tuple[()]:
    links = sdk_compat.span_links(span)
    if not links:
        return ()  # most spans have none: no list to allocate (orjson writes a tuple as [])
    return [{"trace_id": "%032x" % link.context.trace_id, "span_id": "%016x" % link.context.span_id} for link in links]


def _events(span: ReadableSpan) -> list[dict[str, Any]] | tuple[()]:
    events = sdk_compat.span_events(span)
    if not events:
        return ()
    return [{"name": event.name, "t": event.timestamp, "attrs": sdk_compat.attribute_mapping(event.attributes)} for event in events]


def _hostname() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


class _FileNames:
    """Where one process's journal files go: the file for each sequence number."""

    def __init__(self, target: str, pid: int, start_s: int) -> None:
        match = _FILE_TARGET.match(target)
        self.directory: str | None = None if match else target
        if match:
            self._base = match["base"]
            self.first_seq = int(match["seq"] or 0)
        else:
            self._base = os.path.join(target, f"vlmtrace-{_hostname()}-{pid}-{start_s}")
            self.first_seq = 0
        self._pid = pid

    def path(self, seq: int) -> str:
        if self.directory is not None:
            return f"{self._base}.{seq}.jsonl"
        return self._base if seq == 0 else f"{self._base}.{seq}"

    def for_this_process_only(self) -> None:
        """A file target held by another live process: this one writes `<stem>-<pid>.jsonl` beside it."""
        self._base = f"{self._base[: -len('.jsonl')]}-{self._pid}.jsonl"
        self.first_seq = 0


class _MappedTail:
    """A window of the file past its last record, mapped shared; appending is a copy into it.

    Each window is reserved on disk (`posix_fallocate`) before it is mapped, so a full disk shows
    up as an error when a window is opened, never as SIGBUS while a record is copied. Only one
    window is mapped at a time, so the journal adds at most WINDOW bytes to the process's RSS.
    The first write to each page of a window faults (~7 µs on ext4, one page per 1–15 records);
    `prefault` takes those faults at once, from the sampler's thread instead of the request path.
    """

    WINDOW = 1 << 20
    _MADV_POPULATE_WRITE = 23  # Linux 5.14; Python names it only where its build headers had it

    def __init__(self, fd: int, end: int) -> None:
        self._fd = fd
        self.end = end
        self._map: mmap.mmap | None = None
        self._open_window(end - end % self.WINDOW)

    def _open_window(self, start: int) -> None:
        os.posix_fallocate(self._fd, start, self.WINDOW)
        mapping = mmap.mmap(self._fd, self.WINDOW, offset=start)
        if self._map is not None:
            self._map.close()
        self._map = mapping
        self._window_start = start
        self.prefaulted = False

    def prefault(self) -> None:
        """Fault in the whole window, writable; where the kernel cannot (before 5.14), writes fault as they go."""
        self.prefaulted = True
        try:
            self._map.madvise(getattr(mmap, "MADV_POPULATE_WRITE", self._MADV_POPULATE_WRITE))
        except (OSError, ValueError, AttributeError):
            pass

    def append(self, line: bytes) -> None:
        """Copy one line after the last; a line that crosses the window's end continues in the next."""
        offset = self.end - self._window_start
        size = len(line)
        if offset + size <= self.WINDOW:
            self._map[offset:offset + size] = line
            self.end += size
            return
        written = 0
        while written < len(line):
            offset = self.end - self._window_start
            if offset == self.WINDOW:
                self._open_window(self.end)
                offset = 0
            chunk = min(len(line) - written, self.WINDOW - offset)
            self._map[offset:offset + chunk] = line[written:written + chunk]
            written += chunk
            self.end += chunk

    def close(self, truncate: bool) -> None:
        """Unmap; with `truncate`, cut the reserved zeros so the file ends with its last record."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if truncate:
            os.ftruncate(self._fd, self.end)


class JournalWriter:
    """Appends journal records for one process, rotating files by size and keeping at most `max_files`.

    Writes come from whichever thread produced the record; a short lock orders the copies into
    the mapped tail. Rotation swaps the file underneath a fixed descriptor number with `dup2`, so a
    writer never holds a stale descriptor and faulthandler keeps pointing at the current file.
    """

    path: str

    @classmethod
    def open(
        cls,
        target: str,
        *,
        max_bytes: int,
        max_files: int,
        resource: Mapping[str, Any],
        versions: Mapping[str, str],
    ) -> JournalWriter | None:
        """Open the journal at `target` (a `.jsonl` file or a directory); None and one warning if it cannot be written."""
        try:
            return cls(target, max_bytes=max_bytes, max_files=max_files, resource=resource, versions=versions)
        except Exception as error:  # noqa: BLE001 - the service must run on without a journal
            _log.warning(
                "vlmtrace: cannot write the journal at %s (%s: %s); tracing continues without a crash record",
                target,
                type(error).__name__,
                error,
            )
            return None

    def __init__(
        self,
        target: str,
        *,
        max_bytes: int,
        max_files: int,
        resource: Mapping[str, Any],
        versions: Mapping[str, str],
    ) -> None:
        self._target = os.path.abspath(os.fspath(target))  # rotation must not follow a later chdir
        self._max_bytes = max_bytes
        self._max_files = max(1, max_files)
        self._resource = dict(resource)
        self._versions = {k: v for k, v in versions.items() if v is not None}
        self._rotation_lock = threading.Lock()
        self._append_lock = threading.Lock()
        self._tail: _MappedTail | None = None
        self._closed = False
        self._fatal_actions: dict = {}
        self._check_fatal_signals = True
        self._reset_process_state()
        fd = self._open_first()
        self._fd = fd
        self._map_tail()
        self._ready = True
        self._arm_faulthandler()
        after_fork_in_child(self._after_fork_in_child)

    # -- records -------------------------------------------------------------------------

    def write_span_start(self, record: Mapping[str, Any]) -> None:
        """A `start` record (built by JournalSpanProcessor)."""
        next(self._spans_started)
        self._write(record)

    def write_span_end(self, record: Mapping[str, Any]) -> None:
        """An `end` record (built by JournalSpanProcessor)."""
        next(self._spans_ended)
        self._write(record)

    def write_sample(self, t_ns: int, attrs: Mapping[str, Any]) -> None:
        """A `sample` record, from the sampler's thread: also where a rate-limited `dropped` record left
        pending gets written, a new mapped window is faulted in, and the fatal-signal handlers are checked."""
        self._write({"k": "sample", "t": t_ns, "attrs": attrs if isinstance(attrs, dict) else dict(attrs)})
        if self._dropped_pending and time.monotonic_ns() >= self._next_dropped_ns:
            self._write_dropped()
        tail = self._tail
        if tail is not None and not tail.prefaulted:
            with self._append_lock:
                if tail is self._tail:
                    tail.prefault()
        if self._check_fatal_signals:
            self.reclaim_fatal_signals()

    def warn(self, source: str, message: str) -> None:
        """A `warning` record, once per distinct (source, message)."""
        key = (source, message)
        if key in self._warned or len(self._warned) >= _MAX_DISTINCT_WARNINGS:
            return
        self._warned.add(key)
        self._write({"k": "warning", "t": time.time_ns(), "source": source, "message": message})

    def note_dropped(self, otlp_spans: int) -> None:
        """Record the total of spans the OTLP exporter dropped so far; at most one `dropped` record a second."""
        self._otlp_dropped = max(self._otlp_dropped, otlp_spans)
        self._dropped_pending = True
        if time.monotonic_ns() >= self._next_dropped_ns:
            self._write_dropped()

    def note_lost_record(self) -> None:
        """Count a record that could not be built or written; reported in the next `dropped` record."""
        self._journal_lost += 1
        self._dropped_pending = True

    def close(self, clean: bool = True) -> None:
        """Write a pending `dropped` record and the `end_marker`, then stop; later writes are ignored. Idempotent."""
        with self._rotation_lock:
            if self._closed:
                return
            self._closed = True
            was_ready, self._ready = self._ready, False  # writers from here on skip: the end marker stays last
            try:
                if was_ready:
                    if self._dropped_pending:
                        self._write_line(_dumps(self._dropped_record()))
                    self._write_line(
                        _dumps(
                            {
                                "k": "end_marker",
                                "t": time.time_ns(),
                                "clean": clean,
                                "spans_started": next(self._spans_started),
                                "spans_ended": next(self._spans_ended),
                            }
                        )
                    )
            finally:
                with self._append_lock:
                    self._unmap_tail(truncate=True)
                self._disarm_faulthandler()
                self._park_descriptor()

    # -- writing -------------------------------------------------------------------------

    def _write(self, record: Mapping[str, Any]) -> None:
        if not self._ready and not self._reopen_after_fork():
            return
        try:
            line = _dumps(record)
        except Exception:  # noqa: BLE001 - a record that cannot be encoded is counted, never raised
            self.note_lost_record()
            return
        if self._write_line(line) and self._size >= self._max_bytes:
            self._rotate()

    def _write_line(self, line: bytes) -> bool:
        """Hand one line to the kernel: a copy into the mapped tail, or one `os.write`; a short write
        (disk full) is completed so the next line starts fresh."""
        with self._append_lock:
            tail = self._tail
            try:
                if tail is not None:
                    tail.append(line)
                    self._size = tail.end
                    return True
                written = os.write(self._fd, line)
                if written < len(line):
                    written += os.write(self._fd, line[written:])
            except (OSError, ValueError) as error:
                self._report_io_error(error if isinstance(error, OSError) else OSError(str(error)))
                self.note_lost_record()
                if tail is not None:
                    self._tail = None  # the next window could not be reserved: fall back to write(2)
                    self._size = tail.end
                return False
            self._size += written
            return True

    def _map_tail(self) -> None:
        """Map the current file's tail; where the file system cannot, records go through `os.write`."""
        try:
            self._tail = _MappedTail(self._fd, self._size)
        except (OSError, ValueError) as error:
            self._tail = None
            _log.info("vlmtrace: the journal %s cannot be memory-mapped (%s); records use write(2)", self.path, error)

    def _unmap_tail(self, truncate: bool) -> None:
        """Unmap the tail; the caller holds `_append_lock` (or no other thread can write)."""
        tail, self._tail = self._tail, None
        if tail is not None:
            try:
                tail.close(truncate)
            except OSError as error:
                self._report_io_error(error)

    def _write_dropped(self) -> None:
        self._write(self._dropped_record())

    def _dropped_record(self) -> dict[str, Any]:
        self._dropped_pending = False
        self._next_dropped_ns = time.monotonic_ns() + _DROPPED_INTERVAL_NS
        return {
            "k": "dropped",
            "t": time.time_ns(),
            "otlp_spans": self._otlp_dropped,
            "journal_records": self._journal_lost,
        }

    def _report_io_error(self, error: OSError) -> None:
        if not self._io_error_reported:
            self._io_error_reported = True
            _log.warning(
                "vlmtrace: writing the journal %s failed (%s); records are counted as lost until writes succeed again",
                self.path,
                error,
            )

    def _header_line(self, seq: int) -> bytes:
        return _dumps(
            {
                "k": "header",
                "v": FORMAT_VERSION,
                "t": time.time_ns(),
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "host": socket.gethostname(),
                "seq": seq,
                "resource": self._resource,
                "versions": self._versions,
                "argv": list(sys.argv),
                "sampling": "all spans, whatever the tracer provider's sampler exports",
            }
        )

    # -- files ---------------------------------------------------------------------------

    def _reset_process_state(self) -> None:
        """Counters and names that belong to one process (a forked child starts its own)."""
        self._names = _FileNames(self._target, os.getpid(), int(time.time()))
        self._files: collections.deque[str] = collections.deque()
        self._spans_started = itertools.count()  # next() is atomic in CPython: no lock
        self._spans_ended = itertools.count()
        self._warned: set[tuple[str, str]] = set()
        self._otlp_dropped = 0
        self._journal_lost = 0
        self._dropped_pending = False
        self._next_dropped_ns = 0
        self._io_error_reported = False
        self._size = 0

    def _open_first(self) -> int:
        """Open the first file of this process and write its header; returns the descriptor."""
        if self._names.directory is not None:
            os.makedirs(self._names.directory, exist_ok=True)
        else:
            parent = os.path.dirname(self._names.path(self._names.first_seq))
            if parent:
                os.makedirs(parent, exist_ok=True)
        opened = self._open_unlocked(self._names.first_seq, skip_locked=False)
        if opened is None:
            self._names.for_this_process_only()
            opened = self._open_unlocked(self._names.first_seq, skip_locked=False)
        if opened is None:
            raise OSError(f"the journal file for {self._target} is held by another process")
        fd, path, seq = opened
        try:
            self._start_file(fd, path, seq)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_unlocked(self, seq: int, *, skip_locked: bool) -> tuple[int, str, int] | None:
        """Open file `seq`, or with `skip_locked` the next one no other live process holds (file targets can be shared)."""
        for candidate in range(seq, seq + (_MAX_LOCKED_SKIPS if skip_locked else 1)):
            path = self._names.path(candidate)
            fd = os.open(path, _OPEN_FLAGS, 0o644)
            if _try_lock(fd):
                return fd, path, candidate
            os.close(fd)
        return None

    def _start_file(self, fd: int, path: str, seq: int) -> None:
        header = self._header_line(seq)
        existing = os.fstat(fd).st_size
        os.write(fd, header)
        self.path = path
        self._seq = seq
        self._size = existing + len(header)
        self._files.append(path)
        while len(self._files) > self._max_files:
            _remove_quietly(self._files.popleft())

    def _rotate(self) -> None:
        """Writers past the size limit wait here while one of them opens the next file, so a file
        overshoots `max_bytes` by at most one record per writing thread."""
        self._rotation_lock.acquire()
        try:
            if self._closed or self._size < self._max_bytes:
                return
            opened = self._open_unlocked(self._seq + 1, skip_locked=True)
            if opened is None:
                self._size = 0  # try again after another max_bytes
                return
            fd, path, seq = opened
            try:
                with self._append_lock:  # writers wait while the file under the descriptor changes
                    self._unmap_tail(truncate=True)
                    self._start_file(fd, path, seq)
                    os.dup2(fd, self._fd, inheritable=False)
                    self._map_tail()
            finally:
                os.close(fd)
        except OSError as error:
            self._report_io_error(error)
            self._size = 0
        finally:
            self._rotation_lock.release()

    def _park_descriptor(self) -> None:
        """Point the descriptor number at /dev/null instead of closing it.

        A thread that raced `close()` may still write to this number; closed, the number
        could be reused by another file of the application and receive a journal line.
        """
        try:
            devnull = os.open(os.devnull, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.dup2(devnull, self._fd, inheritable=False)
            finally:
                os.close(devnull)
        except OSError:
            os.close(self._fd)

    def _after_fork_in_child(self) -> None:
        """A forked child must not write into its parent's file: park the inherited descriptor, reopen lazily."""
        self._rotation_lock = threading.Lock()
        self._append_lock = threading.Lock()
        if self._closed:
            return
        self._ready = False
        self._unmap_tail(truncate=False)
        self._park_descriptor()

    def _reopen_after_fork(self) -> bool:
        with self._rotation_lock:
            if self._closed:
                return False
            if self._ready:
                return True
            try:
                self._reset_process_state()
                fd = self._open_first()
                os.dup2(fd, self._fd, inheritable=False)
                os.close(fd)
                self._map_tail()
            except OSError as error:
                self._closed = True
                _log.warning("vlmtrace: forked process %d cannot open its own journal (%s)", os.getpid(), error)
                return False
            self._ready = True
            return True

    # -- fatal signals -------------------------------------------------------------------

    def _arm_faulthandler(self) -> None:
        """Send fatal-signal stacks of all threads into this journal, unless the application set up faulthandler."""
        global _faulthandler_holder
        with _faulthandler_lock:
            if _faulthandler_holder is None and faulthandler.is_enabled():
                message = (
                    "faulthandler was already enabled by the application; fatal-signal stacks go to its file, "
                    "not to the journal"
                )
                _log.warning("vlmtrace: %s", message)
                self.warn("faulthandler", message)
                self._faulthandler_previous = None
                return
            self._faulthandler_previous = _faulthandler_holder
            faulthandler.enable(file=self._fd, all_threads=True)
            self._fatal_actions = fatal_signals.installed()
            _faulthandler_holder = self

    def reclaim_fatal_signals(self) -> None:
        """Put faulthandler back in front of a fatal-signal handler that a native library installed after it.
        Every sample checks (five `sigaction` calls, 25 µs on the development VM, off the request path);
        the library's handler still runs after the stacks are written."""
        with _faulthandler_lock:
            if _faulthandler_holder is not self or self._closed:
                return
            try:
                taken = fatal_signals.taken_over(self._fatal_actions)
                if not taken:
                    return
                faulthandler.disable()
                fatal_signals.install(taken)
                faulthandler.enable(file=self._fd, all_threads=True)
                self._fatal_actions = fatal_signals.installed()
            except Exception as error:  # noqa: BLE001 - the stacks are a bonus, the service must go on
                self.warn("faulthandler", f"cannot check the fatal-signal handlers ({type(error).__name__}: {error})")
                self._check_fatal_signals = False
                return
        message = (f"the handler for {fatal_signals.names(taken)} was replaced after vlmtrace armed faulthandler "
                   f"(by {fatal_signals.owners(taken)}); faulthandler is back in front and calls it after the stacks")
        _log.info("vlmtrace: %s", message)
        self.warn("faulthandler", message)

    def _disarm_faulthandler(self) -> None:
        """Hand faulthandler back to the previous open journal, or disable it if we had enabled it."""
        global _faulthandler_holder
        with _faulthandler_lock:
            if _faulthandler_holder is not self:
                return
            previous = self._faulthandler_previous
            while previous is not None and previous._closed:
                previous = previous._faulthandler_previous
            if previous is None:
                faulthandler.disable()
            else:
                faulthandler.enable(file=previous._fd, all_threads=True)
            _faulthandler_holder = previous


def _try_lock(fd: int) -> bool:
    """Take an advisory lock that lives as long as this process holds the file open."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # the filesystem has no flock (some network mounts): do without
    return True


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class JournalSpanProcessor(SpanProcessor):
    """Writes a `start` record when a span starts and an `end` record when it ends, from the calling thread.

    The start record is what makes a span that never ends (the process died inside it) visible.
    """

    def __init__(self, writer: JournalWriter) -> None:
        self._writer = writer

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        try:
            context = span.context
            parent = span.parent
            self._writer.write_span_start(
                {
                    "k": "start",
                    "t": span.start_time,
                    "trace_id": "%032x" % context.trace_id,
                    "span_id": "%016x" % context.span_id,
                    "parent_id": None if parent is None else "%016x" % parent.span_id,
                    "name": span.name,
                    "kind": _KIND_NAMES[span.kind],
                    "thread": threading.current_thread().name,
                    "attrs": sdk_compat.span_attributes(span),
                    "links": _links(span),
                }
            )
        except Exception:  # noqa: BLE001 - never let tracing break the traced call
            self._writer.note_lost_record()

    def on_end(self, span: ReadableSpan) -> None:
        scope = span.instrumentation_scope
        if scope is not None and scope.name == semconv.INSTRUMENTATION_SCOPE:
            return  # vlmtrace's own spans were journaled by the recorder as they started and ended
        try:
            context = span.context
            parent = span.parent
            status = span.status
            self._writer.write_span_end(
                {
                    "k": "end",
                    "t": span.end_time,
                    "start": span.start_time,
                    "trace_id": "%032x" % context.trace_id,
                    "span_id": "%016x" % context.span_id,
                    "parent_id": None if parent is None else "%016x" % parent.span_id,
                    "name": span.name,
                    "kind": _KIND_NAMES[span.kind],
                    "status": _STATUS_NAMES[status.status_code],
                    "status_message": status.description,
                    "attrs": sdk_compat.span_attributes(span),
                    "events": _events(span),
                    "links": _links(span),
                }
            )
        except Exception:  # noqa: BLE001 - never let tracing break the traced call
            self._writer.note_lost_record()

    def shutdown(self) -> None:
        self._writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered: every record is already in the kernel."""
        return True
