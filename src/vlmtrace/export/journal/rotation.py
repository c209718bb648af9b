"""The journal's files as one writer goes through them (docs/journal.md, Files): the first file and its
header, rotation by size under a fixed descriptor, the mapped tail of the current file, a file deleted
under the writer, a journal that stalls (no next file can be opened) and retries, and the end at a full disk.
`JournalWriter` (writer.py) builds on it with the records and how they are written.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from vlmtrace.export.journal import records
from vlmtrace.export.journal.compact import Compactor
from vlmtrace.export.journal.files import FileNames, open_first, open_locked, remove_quietly, write_header
from vlmtrace.export.journal.tail import DiskFull, MappedTail, write_whole

_log = logging.getLogger(__name__)

RETRY_NS = 1_000_000_000  # a stalled journal tries a new file this often (from the sampler's thread)


class JournalFiles:
    """The files of one process's journal, the current one under the descriptor `_fd`."""

    path: str
    _target: str
    _max_bytes: int
    _max_files: int
    _resource: dict[str, Any]
    _versions: dict[str, str]
    _names: FileNames
    _files: collections.deque[str]
    _seq: int
    _fd: int
    _tail: MappedTail | None
    _closed: bool
    _rotation_lock: threading.Lock
    _append_lock: threading.Lock
    _compactor: Compactor
    # One process's state (a forked child starts its own).
    _dropped_pending: bool
    _io_error_reported: bool
    _disk_full: bool
    _stalled: str | None  # why no file can take records now
    _stall_reported: bool
    _next_retry_ns: int
    _size: int

    def _write_closing(self, record: Mapping[str, Any]) -> None:
        """A record that ends the journal: into the tail's reserve if the disk is full. The caller holds
        `_append_lock`."""
        line = records.encode(record)
        try:
            if self._tail is not None:
                self._tail.append_closing(line)
                self._size = self._tail.end
            else:
                self._size += write_whole(self._fd, line, self._size)
        except OSError as error:
            self._report_io_error(error)

    def _stop_at_full_disk(self) -> None:
        """The file system is full: end the journal with a `disk_full` record (the tail keeps room for it and
        for the closing records); later records are counted as dropped, in the `dropped` record at close."""
        self._disk_full = True
        self._dropped_pending = True
        _log.warning(
            "vlmtrace: the journal %r stopped: no space left on its file system; later records are counted as dropped",
            self.path,
        )
        self._write_closing(records.disk_full_record(self.path))

    def _check_file(self) -> None:
        """A file deleted under the writer (its directory removed) takes records nowhere: stall; a stalled
        journal tries a new file once a second, and goes on there once one opens."""
        if self._stalled is None:
            try:
                deleted = os.fstat(self._fd).st_nlink == 0
            except OSError:
                return
            if deleted:
                with self._rotation_lock:
                    self._stall("its file was deleted")
        elif time.monotonic_ns() >= self._next_retry_ns:
            self._next_retry_ns = time.monotonic_ns() + RETRY_NS
            self._rotate(retry=True)
            if self._stalled is None:
                _log.warning("vlmtrace: the journal goes on in %r", self.path)

    def _stall(self, reason: str) -> None:
        """No file can take records now: count them as dropped (the `dropped` record at close), warn once,
        and let `maintain` try a new file. The caller holds `_rotation_lock`."""
        if self._stalled is None and not self._stall_reported:
            _log.warning(
                "vlmtrace: the journal %r stopped: %s; records are counted as dropped until a new file "
                "can be opened (tried every second)",
                self.path,
                reason,
            )
        self._stall_reported = True
        self._stalled = reason
        self._dropped_pending = True
        self._next_retry_ns = time.monotonic_ns() + RETRY_NS

    def _report_io_error(self, error: OSError) -> None:
        if not self._io_error_reported:
            self._io_error_reported = True
            _log.warning(
                "vlmtrace: writing the journal %r failed (%s); records are counted as lost until writes succeed again",
                self.path,
                error,
            )

    def _new_tail(self, fd: int, size: int) -> MappedTail | None:
        """A mapped tail that owns `fd`; None where the file system cannot map files (records then go
        through `os.write`, and `fd` stays the caller's). A file system already full raises DiskFull."""
        try:
            return MappedTail(fd, size)
        except DiskFull:
            raise
        except (OSError, ValueError) as error:
            _log.info("vlmtrace: the journal %s cannot be memory-mapped (%s); records use write(2)", self.path, error)
            return None

    def _map_tail(self) -> None:
        """Map the tail of the file under the writer's descriptor (the tail gets a duplicate of it)."""
        spare = os.dup(self._fd)
        self._tail = self._new_tail(spare, self._size)
        if self._tail is None:
            os.close(spare)

    def _unmap_tail(self, truncate: bool) -> None:
        """Unmap the tail; the caller holds `_append_lock` (or no other thread can write)."""
        tail, self._tail = self._tail, None
        if tail is not None:
            try:
                tail.close(truncate)
            except OSError as error:
                self._report_io_error(error)

    def _open_first(self) -> int:
        """Open the first file of this process and write its header; returns the descriptor."""
        fd, path, seq = open_first(self._names, self._target)
        try:
            self._file_started(path, seq, self._write_header(fd, seq))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _write_header(self, fd: int, seq: int) -> int:
        """Write a file's header; returns the file's size after it."""
        return write_header(fd, records.encode(records.header_record(seq, self._resource, self._versions)))

    def _file_started(self, path: str, seq: int, size: int) -> None:
        self._compactor.forget()  # an end in this file never leaves out what a start in another said
        self.path = path
        self._seq = seq
        self._size = size
        self._files.append(path)
        while len(self._files) > self._max_files:
            remove_quietly(self._files.popleft())

    def _rotate(self, retry: bool = False) -> None:
        """Writers past the size limit wait here while one of them opens the next file, so a file
        overshoots `max_bytes` by at most one record per writing thread. The next file is ready (header
        written, tail reserved) before the current one is let go: if the disk is full, the journal ends
        in the current file, whose tail still holds the reserve for the closing records. Where no next
        file can be opened (a read-only or deleted directory), the journal stalls (`_stall`): the current
        file never grows past its bound. `retry`: a stalled journal's try."""
        with self._rotation_lock:
            if self._closed or (self._size < self._max_bytes and not retry):
                return
            try:
                opened = open_locked(self._names, self._seq + 1, skip=True)
            except OSError as error:
                self._stall(f"no new file can be opened ({error.strerror or error})")
                return
            if opened is None:
                self._stall("every next file name is held by another process")
                return
            fd, path, seq = opened
            try:
                size = self._write_header(fd, seq)
                tail = self._new_tail(fd, size)
            except OSError as error:
                os.close(fd)
                remove_quietly(path)
                with self._append_lock:
                    if isinstance(error, DiskFull):
                        self._stop_at_full_disk()
                    else:
                        self._stall(f"no new file can be written ({error.strerror or error})")
                return
            with self._append_lock:  # writers wait while the file under the descriptor changes
                os.dup2(fd, self._fd, inheritable=False)  # first: from here faulthandler reports into the new file
                if tail is None:
                    os.close(fd)
                self._unmap_tail(truncate=True)
                self._tail = tail
                self._file_started(path, seq, size)
                self._stalled = None
