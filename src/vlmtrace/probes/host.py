"""Resident host memory of this process, the cheapest way the platform allows: on a span boundary, the
compiled core's read of /proc/self/statm (one C call: ~6 µs warm where libc's pread through ctypes and
Python's parse take ~12), else that ctypes read."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from vlmtrace import compiled

if TYPE_CHECKING:
    import psutil

STATM_BYTES = 128
_forks = 0  # forks this process came through (counted in the child): a child reopens /proc/self (`_open`)


def _forked() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _libc_pread(fd: int, buffer: ctypes.Array) -> Callable[[], int] | None:
    """libc's pread of /proc/self/statm into `buffer`, called *holding* the GIL (ctypes.PyDLL), its
    arguments bound once as C values (no conversion per call: ~0.9 µs where declared argument types
    take ~1.8 µs); None where there is no libc pread.

    os.pread releases the GIL around the system call; on a span boundary inside a serving engine another
    thread then takes it, and getting it back can wait for that thread's switch interval (5 ms). Reading
    /proc/self/statm takes a few microseconds in the kernel, so holding the GIL through it is cheaper."""
    try:
        function = ctypes.PyDLL(None).pread
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_ssize_t
    # One byte short of the buffer: the text read is always followed by a NUL (`buffer.value`).
    return functools.partial(function, ctypes.c_int(fd), buffer, ctypes.c_size_t(STATM_BYTES - 1), ctypes.c_long(0))


class HostMemoryProbe:
    """`/proc/self/statm` through a descriptor kept open (a pread, ~1 µs); psutil elsewhere."""

    def __init__(self) -> None:
        self._page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._statm: int | None = None
        self._process: psutil.Process | None = None  # where /proc/self/statm cannot be opened
        self._pread: Callable[[], int] | None = None
        self._buffer = ctypes.create_string_buffer(STATM_BYTES)
        core = compiled.core()
        self._core_read: Callable[[int, int], int] | None = core.statm_rss if core is not None else None
        self._open()

    def _open(self) -> None:
        """/proc/self resolves at open time, so a forked child must open its own."""
        self.close()
        self._forks = _forks
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            import psutil

            self._process = psutil.Process()
            return
        if self._core_read is None:
            self._pread = _libc_pread(self._statm, self._buffer)

    def rss(self) -> int:
        """For the background sampler's thread: the GIL is released while the kernel answers."""
        if self._forks != _forks:
            self._open()
        if self._statm is not None:
            return int(os.pread(self._statm, STATM_BYTES, 0).split()[1]) * self._page_size
        process = self._process
        assert process is not None  # opened by `_open` where /proc/self/statm cannot be
        return int(process.memory_info().rss)

    def rss_on_request_path(self) -> int:
        """For a span boundary: the GIL is held throughout (see _libc_pread)."""
        if self._forks != _forks:
            return self.rss()
        if self._core_read is not None and self._statm is not None:
            try:
                return self._core_read(self._statm, self._page_size)
            except OSError:
                return self.rss()
        if self._pread is None:
            return self.rss()
        if self._pread() <= 0:
            return self.rss()
        # Only the first two fields are parsed, and every read rewrites them: what an older, longer
        # read left behind the text stays in the unsplit rest.
        return int(self._buffer.value.split(None, 2)[1]) * self._page_size

    def close(self) -> None:
        self._pread = None
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None
