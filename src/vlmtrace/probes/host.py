"""Resident host memory of this process, the cheapest way the platform allows."""

from __future__ import annotations

import ctypes
import os

STATM_BYTES = 128


def _libc_pread():
    """libc's pread called *holding* the GIL (ctypes.PyDLL), or None where there is none.

    os.pread releases the GIL around the system call; on a span boundary inside a serving engine another
    thread then takes it, and getting it back can wait for that thread's switch interval (5 ms). Reading
    /proc/self/statm takes a few microseconds in the kernel, so holding the GIL through it is cheaper."""
    try:
        function = ctypes.PyDLL(None).pread
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_ssize_t
    function.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
    return function


class HostMemoryProbe:
    """`/proc/self/statm` through a descriptor kept open (a pread, ~2 µs); psutil elsewhere."""

    def __init__(self) -> None:
        self._page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._statm: int | None = None
        self._pid = 0
        self._process = None
        self._pread = _libc_pread()
        self._buffer = ctypes.create_string_buffer(STATM_BYTES)
        self._open()

    def _open(self) -> None:
        """/proc/self resolves at open time, so a forked child must open its own."""
        self.close()
        self._pid = os.getpid()
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            import psutil

            self._process = psutil.Process()

    def rss(self) -> int:
        """For the background sampler's thread: the GIL is released while the kernel answers."""
        if self._pid != os.getpid():
            self._open()
        if self._statm is not None:
            return int(os.pread(self._statm, STATM_BYTES, 0).split()[1]) * self._page_size
        return int(self._process.memory_info().rss)

    def rss_on_request_path(self) -> int:
        """For a span boundary: the GIL is held throughout (see _libc_pread)."""
        if self._pread is None or self._statm is None or self._pid != os.getpid():
            return self.rss()
        length = self._pread(self._statm, self._buffer, STATM_BYTES, 0)
        if length <= 0:
            return self.rss()
        return int(self._buffer.raw[:length].split()[1]) * self._page_size

    def close(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None
