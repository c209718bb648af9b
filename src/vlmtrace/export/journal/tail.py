"""The mapped tail: the file past its last record, reserved on disk and mapped shared; appending is a copy.

The mapped pages belong to the kernel's page cache, so a process killed at any moment (SIGKILL,
`std::terminate`) loses at most the record being copied, as with one `write(2)` per record, but
appending makes no system call (why that matters on the request path: docs/journal.md).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os


class DiskFull(OSError):
    """No more space could be reserved: the record was not written, not even in part."""


_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def write_whole(fd: int, line: bytes, size: int) -> int:
    """One `os.write` of whole lines at the end of a file of `size` bytes, where the file cannot be mapped;
    a write that fails or falls short is cut off again (`ftruncate`), so the file never holds part of a
    record. No space raises DiskFull."""
    try:
        written = os.write(fd, line)
        if written < len(line):
            written += os.write(fd, line[written:])
        if written < len(line):
            raise OSError(errno.ENOSPC, "short write")
    except OSError as error:
        os.ftruncate(fd, size)
        if error.errno in _FULL_ERRNOS:
            raise DiskFull(error.errno, error.strerror) from None
        raise
    return written


class MappedTail:
    """Appends lines into the reserved, mapped space past the file's last record.

    Space is reserved (`posix_fallocate`) before it is mapped and written, so a full disk shows up as
    `DiskFull` before any byte of a record is copied, never as SIGBUS or a line torn mid-file. The
    last RESERVE bytes reserved are kept for `append_closing`: whatever happens, the records that end
    the journal (disk full, the dropped count, the end marker) have room. Near a full disk the
    reservation steps down from WINDOW to single pages, so the journal uses the space there is.
    Only the window being written is mapped, so the journal adds about WINDOW bytes to the RSS.
    """

    WINDOW = 1 << 20
    RESERVE = 4096
    _STEPS = (WINDOW, 1 << 16, mmap.PAGESIZE)
    _MADV_POPULATE_WRITE = 23  # Linux 5.14; Python names it only where its build headers had it

    def __init__(self, fd: int, end: int) -> None:
        """`fd`: a descriptor of the file, owned by the tail from here on (closed by `close`, or here on error)."""
        self._fd = fd
        self.end = end
        self._reserved = end
        self._limit = end - self.RESERVE  # appends up to here leave the reserve free
        self._map: mmap.mmap | None = None
        self._map_start = 0
        self.prefaulted = True
        try:
            self._reserve(self.RESERVE)
        except BaseException:
            self.close(truncate=False)
            raise

    def append(self, line: bytes) -> None:
        """Copy one line after the last, reserving more space first where it would eat into the reserve."""
        size = len(line)
        end = self.end
        if end + size > self._limit:
            self._reserve(size + self.RESERVE)
        offset = end - self._map_start
        mapping = self._map
        assert mapping is not None  # mapped from __init__ until close
        mapping[offset : offset + size] = line
        self.end = end + size

    def append_closing(self, line: bytes) -> None:
        """Copy one of the records that end the journal, into the reserve if no more space can be had."""
        size = len(line)
        try:
            self._reserve(size + self.RESERVE)
        except DiskFull:
            if self.end + size > self._reserved:
                raise
        offset = self.end - self._map_start
        mapping = self._map
        assert mapping is not None  # mapped from __init__ until close
        mapping[offset : offset + size] = line
        self.end += size

    def prefault(self) -> None:
        """Fault in the mapped window, writable, from a background thread, so the request path does not take
        the fault of each page's first write (docs/journal.md gives its cost). Where the kernel cannot
        (before 5.14), writes fault as they go."""
        self.prefaulted = True
        mapping = self._map
        if mapping is None:
            return
        with contextlib.suppress(OSError, ValueError, AttributeError):
            mapping.madvise(getattr(mmap, "MADV_POPULATE_WRITE", self._MADV_POPULATE_WRITE))

    def close(self, truncate: bool) -> None:
        """Unmap and close; with `truncate`, cut the reserved zeros so the file ends with its last record
        (and where faulthandler appended its report after them, keep them: the reader skips zeros)."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd < 0:
            return
        try:
            # Not where something was appended past the reserved space: that is faulthandler's report.
            if truncate and os.fstat(self._fd).st_size <= self._reserved:
                os.ftruncate(self._fd, self.end)
        finally:
            os.close(self._fd)
            self._fd = -1

    def _reserve(self, needed: int) -> None:
        """Reserve and map space until `needed` bytes fit after the last record; DiskFull if they cannot.

        Never over bytes appended past the reserved space: those are faulthandler's report of a fatal
        signal (the process is dying while threads that released the GIL, such as one in a ctypes call,
        still write records), which a reservation would let later records overwrite."""
        if os.fstat(self._fd).st_size > self._reserved:
            raise OSError(errno.EEXIST, "faulthandler's report follows the reserved space; no more records")
        grown = False
        try:
            while self.end + needed > self._reserved:
                for step in self._STEPS:
                    try:
                        os.posix_fallocate(self._fd, self._reserved, step)
                    except OSError as error:
                        if error.errno not in _FULL_ERRNOS:
                            raise
                        continue
                    self._reserved += step
                    grown = True
                    break
                else:
                    raise DiskFull(errno.ENOSPC, "no space left to reserve for the journal")
        finally:
            if grown or self._map is None:
                self._remap()

    def _remap(self) -> None:
        """Map from the page holding the last record's end to the end of the reserved space."""
        start = self.end - self.end % mmap.ALLOCATIONGRANULARITY
        length = self._reserved - start
        mapping = mmap.mmap(self._fd, length, offset=start) if length > 0 else None
        if self._map is not None:
            self._map.close()
        self._map, self._map_start = mapping, start
        self._limit = self._reserved - self.RESERVE
        self.prefaulted = False
