"""The fatal-signal guard (fatal_guard.c): the first handler of every fatal signal, in C, that bounds
the chain behind it (faulthandler, then the default action or a native library's handler) and ends
the process with the signal's default action if that chain has not finished within BOUND_MS.

It is compiled with the system's C compiler on first use, into the cache native_counters.py uses, by a
daemon thread (`vlmtrace run` builds it before the program starts). Where there is no compiler, or off
Linux, there is no guard: faulthandler alone handles the signals, and is not put back in front of a
library that takes them over (docs/journal.md, Fatal signals).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from vlmtrace.probes.native_counters import cache_dir, compile_library

_log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fatal_guard.c")
BOUND_MS = 1500  # the chain's longest time: a process that aborts is gone within 2 s
BUILD_TIMEOUT_S = 60


class Guard:
    """The loaded library."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._library = library
        library.vlmtrace_guard_front.argtypes = (ctypes.c_int,)
        library.vlmtrace_guard_behind_installed.argtypes = (ctypes.c_int,)
        library.vlmtrace_guard_set_bound_ms.argtypes = (ctypes.c_long,)
        library.vlmtrace_guard_terminating.argtypes = (ctypes.c_int, ctypes.c_long)
        library.vlmtrace_guard_address.restype = ctypes.c_void_p
        library.vlmtrace_guard_set_bound_ms(BOUND_MS)
        self.address: int = library.vlmtrace_guard_address()

    def front(self, signums: Iterable[int]) -> None:
        """Put the guard in front of what is installed now for each signal."""
        for signum in signums:
            if self._library.vlmtrace_guard_front(signum) != 0:
                raise OSError(ctypes.get_errno(), f"cannot install the fatal-signal guard for signal {signum}")

    def behind_installed(self, signums: Iterable[int]) -> None:
        """Pass each signal on to what is installed now (where the guard is no longer in front of it)."""
        for signum in signums:
            self._library.vlmtrace_guard_behind_installed(signum)

    def terminating(self, signum: int, bound_s: float) -> None:
        """Bound a terminating signal's end: put a C handler in front of Python's for `signum` that arms a
        timer; the process ends by the signal's default action `bound_s` after it, if it has not by then."""
        self._library.vlmtrace_guard_terminating(signum, max(1, int(bound_s * 1000)))

    def dying(self) -> bool:
        """A fatal signal's chain is running: handlers change because the process is dying."""
        return bool(self._library.vlmtrace_guard_dying())


def library_path() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + sys.platform.encode()).hexdigest()[:16]
    return cache_dir() / f"fatal_guard-{key}.so"


def find_compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build() -> Path | None:
    """The library, compiled first if it is not in the cache yet; None where it cannot be (said at info level)."""
    if not sys.platform.startswith("linux"):
        return None
    library = library_path()
    if library.exists():
        return library
    compiler = find_compiler()
    if compiler is None:
        _log.info("vlmtrace: no C compiler (gcc, cc or $CC): fatal signals are not guarded against a hanging handler")
        return None
    try:
        compile_library([compiler, "-O2", "-shared", "-fPIC", str(SOURCE)], SOURCE, library, None, BUILD_TIMEOUT_S)
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        _log.info("vlmtrace: the fatal-signal guard cannot be built (%s); faulthandler alone handles fatal signals",
                  error)
        return None
    return library


@functools.cache
def _loaded(path: str) -> Guard | None:
    try:
        return Guard(ctypes.CDLL(path, use_errno=True))
    except (OSError, AttributeError) as error:
        _log.info("vlmtrace: the fatal-signal guard %s cannot be loaded (%s)", path, error)
        return None


def cached() -> Guard | None:
    """The guard if it is built already (a `dlopen`, no compiler); None otherwise."""
    if not sys.platform.startswith("linux"):
        return None
    path = library_path()
    return _loaded(str(path)) if path.exists() else None


def build_in_background(then: Callable[[Guard], None]) -> None:
    """Build the guard off the caller's thread and hand it to `then` once it is loaded."""

    def run() -> None:
        path = build()
        guard = _loaded(str(path)) if path is not None else None
        if guard is not None:
            then(guard)

    threading.Thread(target=run, name="vlmtrace-fatal-guard-build", daemon=True).start()
