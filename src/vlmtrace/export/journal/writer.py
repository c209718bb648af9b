"""The journal writer: one process's records into its files, in order, rotated by size (docs/journal.md)."""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from vlmtrace.export import process_end
from vlmtrace.export.fork import after_fork_in_child, close_in_multiprocessing_children
from vlmtrace.export.journal import records
from vlmtrace.export.journal.batching import RecordQueue
from vlmtrace.export.journal.compact import Compactor
from vlmtrace.export.journal.files import (
    FileNames,
    park_descriptor,
)
from vlmtrace.export.journal.rotation import JournalFiles
from vlmtrace.export.journal.stacks import FatalStacks
from vlmtrace.export.journal.tail import DiskFull, write_whole

_log = logging.getLogger(__name__)

_DROPPED_INTERVAL_NS = 1_000_000_000
_MAX_DISTINCT_WARNINGS = 256

# A record (a mapping), or a span's fields behind the builder that makes its record of them (records.encode).
_Record = Mapping[str, Any] | tuple


class JournalWriter(JournalFiles):
    """Appends journal records for one process, rotating files by size and keeping at most `max_files`.

    By default records are queued and written by the queue's flushing thread (batching.py); at a fatal
    signal, faulthandler writes the stacks (stacks.py) and what is queued is not written. With `sync`, each record is encoded and copied by the
    thread that produced it, under a short lock. Rotation swaps the file underneath a fixed descriptor
    number with `dup2`, so a writer never holds a stale descriptor and faulthandler keeps pointing at
    the current file.
    """

    # One process's state (_reset_process_state: a forked child starts its own), beside JournalFiles'.
    _otlp_dropped: int
    _journal_lost: int
    _next_dropped_ns: int

    @classmethod
    def open(
        cls,
        target: str,
        *,
        max_bytes: int,
        max_files: int,
        resource: Mapping[str, Any],
        versions: Mapping[str, str | None],
        sync: bool = False,
    ) -> JournalWriter | None:
        """Open the journal at `target` (a `.jsonl` file or a directory); None and one warning if it cannot be written."""
        try:
            return cls(
                target, max_bytes=max_bytes, max_files=max_files, resource=resource, versions=versions, sync=sync
            )
        except Exception as error:  # noqa: BLE001 - the service must run on without a journal
            _log.warning(
                "vlmtrace: cannot write the journal at %r (%s: %s); tracing continues without a crash record",
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
        versions: Mapping[str, str | None],
        sync: bool = False,
    ) -> None:
        self._target = os.path.abspath(os.fspath(target))  # rotation must not follow a later chdir
        self._max_bytes = max_bytes
        self._max_files = max(1, max_files)
        self._resource = dict(resource)
        self._versions = {k: v for k, v in versions.items() if v is not None}
        self._rotation_lock = threading.Lock()
        self._append_lock = threading.Lock()
        self._tail = None
        self._closed = False
        self._compactor = Compactor()
        self._queue = (
            None
            if sync
            else RecordQueue(self._compactor.encode, self._write_encoded, self._room, self.note_lost_record)
        )
        # The queue keeps what it is given for records.encode, which takes a span's fields as well.
        self._submit: Callable[[_Record], None] = (
            self._write if self._queue is None else cast("Callable[[_Record], None]", self._queue.put)
        )
        self._reset_process_state()
        self._fd = self._open_first()
        try:
            self._map_tail()
        except BaseException:
            os.close(self._fd)
            raise
        self._ready = True
        self._stacks = FatalStacks(self._fd, self.warn)
        self._stacks.arm()
        after_fork_in_child(self._after_fork_in_child)
        close_in_multiprocessing_children(self)
        process_end.watch(self.close)
        if self._queue is not None:
            self._queue.start()

    # -- records -------------------------------------------------------------------------

    def write_span_start(self, record: _Record) -> None:
        """A `start` record (records.start_record), or its builder and fields (records.start_from_ids)."""
        next(self._spans_started)
        self._submit(record)

    def write_span_end(self, record: _Record) -> None:
        """An `end` record (records.end_record), or its builder and fields (records.end_from_ids)."""
        next(self._spans_ended)
        self._submit(record)

    def write_sample(self, t_ns: int, attrs: Mapping[str, Any]) -> None:
        """A `sample` record (the sampler's memory readings)."""
        self._submit(records.sample_record(t_ns, attrs))

    def write_capture(self, record: Mapping[str, Any]) -> None:
        """A `capture` record (records.capture_record)."""
        self._submit(record)

    def warn(self, source: str, message: str) -> None:
        """A `warning` record, once per distinct (source, message)."""
        key = (source, message)
        if key in self._warned or len(self._warned) >= _MAX_DISTINCT_WARNINGS:
            return
        self._warned.add(key)
        self._submit(records.warning_record(source, message))

    def note_dropped(self, otlp_spans: int) -> None:
        """Record the total of spans the OTLP exporter dropped so far; at most one `dropped` record a second."""
        self._otlp_dropped = max(self._otlp_dropped, otlp_spans)
        self._dropped_pending = True
        if time.monotonic_ns() >= self._next_dropped_ns:
            self._submit(self._dropped_record())

    def note_lost_record(self, count: int = 1) -> None:
        """Count records that could not be built or written; reported in the next `dropped` record."""
        self._journal_lost += count
        self._dropped_pending = True

    def queued(self) -> int:
        """Records waiting for the flushing thread (0 with `sync`)."""
        return 0 if self._queue is None else len(self._queue.pending)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Hand every record queued so far to the kernel; False if another flush held it past `timeout_s`."""
        return self._queue is None or self._queue.drain(timeout_s)

    def maintain(self) -> None:
        """The upkeep that must not run on the request path, for a background thread (the sampler's) to
        call regularly: a rate-limited `dropped` record left pending, faulting in a newly mapped window,
        and putting faulthandler back in front of a native library's fatal-signal handler. Also noticing a
        file deleted under the journal, and trying a new file where the journal stalled."""
        if (
            self._dropped_pending
            and not self._disk_full
            and not self._stalled
            and time.monotonic_ns() >= self._next_dropped_ns
        ):
            self._submit(self._dropped_record())
        if self._ready and not self._closed:
            self._check_file()
        tail = self._tail
        if tail is not None and not tail.prefaulted:
            with self._append_lock:
                if tail is self._tail:
                    tail.prefault()
        if not self._closed:
            self._stacks.reclaim()

    def close(self, clean: bool = True) -> None:
        """Write what is queued, a pending `dropped` record and the `end_marker`, then stop; later records are
        ignored. Idempotent."""
        self._submit = self._ignore
        if self._queue is not None:
            self._queue.stop()
            self._queue.drain()  # outside the rotation lock: writing the queue may rotate
        with self._rotation_lock:
            if self._closed:
                return
            self._closed = True
            was_ready, self._ready = self._ready, False  # writers from here on skip: the end marker stays last
            try:
                if was_ready:
                    with self._append_lock:
                        if self._dropped_pending:
                            self._write_closing(self._dropped_record())
                        self._write_closing(
                            records.end_marker_record(
                                clean, next(self._spans_started), next(self._spans_ended), process_end.ended_by()
                            )
                        )
            finally:
                with self._append_lock:
                    self._unmap_tail(truncate=True)
                self._stacks.release()
                park_descriptor(self._fd)

    # -- writing -------------------------------------------------------------------------

    def _ignore(self, record: _Record) -> None:
        """Records after close."""

    def _room(self) -> int:
        return self._max_bytes - self._size

    def _write(self, record: _Record) -> None:
        """One record, from the thread that made it (`sync`, and the records that must not wait)."""
        try:
            line = self._compactor.encode(record)
        except Exception:  # noqa: BLE001 - a record that cannot be encoded is counted, never raised
            self.note_lost_record()
            return
        self._write_encoded([line])

    def _write_encoded(self, lines: list[bytes]) -> None:
        """Write whole lines; a file past its size limit rotates."""
        if not self._ready and not self._reopen_after_fork():
            return
        if self._write_lines(lines) and self._size >= self._max_bytes:
            self._rotate()

    def _write_lines(self, lines: list[bytes]) -> bool:
        """Hand whole lines to the kernel, never part of one: one copy into the mapped tail (or one `os.write`)
        for them all; when the disk has no room for them all, as many as still fit, one by one. What is
        not written is counted as lost. `lines` is emptied."""
        with self._append_lock:
            try:
                if self._disk_full or self._stalled:
                    self.note_lost_record(len(lines))
                    return False
                self._copy(lines[0] if len(lines) == 1 else b"".join(lines))
                return True
            except DiskFull:
                written = 0
                if len(lines) > 1:
                    try:
                        for line in lines:
                            self._copy(line)
                            written += 1
                    except (OSError, ValueError):
                        pass
                self._stop_at_full_disk()
                self.note_lost_record(len(lines) - written)
            except (OSError, ValueError) as error:
                self._report_io_error(error if isinstance(error, OSError) else OSError(str(error)))
                self.note_lost_record(len(lines))
            finally:
                lines.clear()
            self._compactor.forget()  # the starts of the lines not written are not in the file
            return False

    def _copy(self, data: bytes) -> None:
        """Into the tail, or one `os.write`; the caller holds `_append_lock`."""
        tail = self._tail
        if tail is not None:
            tail.append(data)
            self._size = tail.end
        else:
            self._size += write_whole(self._fd, data, self._size)

    def _dropped_record(self) -> dict[str, Any]:
        self._dropped_pending = False
        self._next_dropped_ns = time.monotonic_ns() + _DROPPED_INTERVAL_NS
        return records.dropped_record(self._otlp_dropped, self._journal_lost)

    # -- files ---------------------------------------------------------------------------

    def _reset_process_state(self) -> None:
        """Counters and names that belong to one process (a forked child starts its own)."""
        self._names = FileNames(self._target, os.getpid(), int(time.time()))
        self._files: collections.deque[str] = collections.deque()
        self._spans_started = itertools.count()  # next() is atomic in CPython: no lock
        self._spans_ended = itertools.count()
        self._warned: set[tuple[str, str]] = set()
        self._otlp_dropped = 0
        self._journal_lost = 0
        self._dropped_pending = False
        self._next_dropped_ns = 0
        self._io_error_reported = False
        self._disk_full = False
        self._stalled = None
        self._stall_reported = False
        self._next_retry_ns = 0
        self._size = 0

    def _after_fork_in_child(self) -> None:
        """A forked child must not write into its parent's file (nor the parent's queued records): park the
        inherited descriptor, reopen at the first record. Threads do not survive a fork: flush anew."""
        self._rotation_lock = threading.Lock()
        self._append_lock = threading.Lock()
        if self._queue is not None:
            self._queue.after_fork_in_child()
        if self._closed:
            return
        self._ready = False
        self._unmap_tail(truncate=False)
        park_descriptor(self._fd)
        self._reset_process_state()  # before the child's first record: its counts start here

    def _reopen_after_fork(self) -> bool:
        with self._rotation_lock:
            if self._closed:
                return False
            if self._ready:
                return True
            try:
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
