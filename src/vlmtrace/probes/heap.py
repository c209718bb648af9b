"""Heap bytes in use (malloc's chunks), where the process was started with heap_counter.c preloaded.

Resident pages place a host leak where the heap next needs fresh pages, not where the memory is kept
(docs/analysis.md, "Host memory at span boundaries"). The preloaded counter changes where malloc and free
are called, so span boundaries can place it; a read is ~0.3 µs. It can only be loaded at a process's start
(`LD_PRELOAD`): `vlmtrace run --heap-counter` builds it (the system's C compiler, into the cache of
native_counters.py) and sets `LD_PRELOAD` for the program and every process it starts. In a process
without it, `in_use_reader()` is None and readings carry no heap key.

The counter also charges large chunks to the stage whose work allocated them (`StageTags`): span
boundaries tell it each thread's stage, the sampler reads the charges (docs/analysis.md, "Large chunks
charged to the stage that allocated them").
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from vlmtrace import semconv as sc
from vlmtrace.probes.native_counters import cache_dir, compile_library

SOURCE = Path(__file__).with_name("heap_counter.c")
SYMBOL = "vlmtrace_heap_in_use"
BUILD_TIMEOUT_S = 60


class HeapCounterUnavailable(RuntimeError):
    """The counter cannot be built here (no C compiler, a failed compile): the message says why."""


def find_compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def library_path() -> Path:
    libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else "other libc"
    key = hashlib.sha256(SOURCE.read_bytes() + libc.encode()).hexdigest()[:16]
    return cache_dir() / f"heap_counter-{key}.so"


def _check_loads(library: str) -> None:
    """A program started with it preloaded must run: where the C library is not glibc (no `__libc_malloc`),
    the loader would refuse it and the user's program would not start at all."""
    done = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.PyDLL(None).{SYMBOL}()"],
                          env={**os.environ, "LD_PRELOAD": library}, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise HeapCounterUnavailable(f"the built library does not load here (glibc only): {last}")


def build() -> Path:
    """The library, compiled first if it is not in the cache yet (a second or so)."""
    library = library_path()
    if library.exists():
        return library
    compiler = find_compiler()
    if compiler is None:
        raise HeapCounterUnavailable("no C compiler (gcc, cc or $CC)")
    try:
        compile_library([compiler, "-O2", "-shared", "-fPIC", str(SOURCE)], SOURCE, library, _check_loads, BUILD_TIMEOUT_S)
    except HeapCounterUnavailable:
        raise
    except RuntimeError as error:
        raise HeapCounterUnavailable(str(error)) from error
    except (OSError, subprocess.SubprocessError) as error:
        raise HeapCounterUnavailable(f"compiling {SOURCE.name} failed: {error}") from error
    return library


def in_use_reader() -> Callable[[], int] | None:
    """The preloaded counter's read, or None where this process was started without it. Called holding
    the GIL (PyDLL): it sums a few counters, far less than a release and re-take would cost."""
    try:
        function = getattr(ctypes.PyDLL(None), SYMBOL)
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int64
    function.argtypes = ()
    return function


class StageTags:
    """The preloaded counter's large chunks, charged to the stage whose work allocated them until they are
    freed, wherever that happens (heap_counter.c). Span boundaries say which stage a thread works in."""

    def __init__(self, library: ctypes.PyDLL) -> None:
        self._set = library.vlmtrace_heap_set_stage
        self._set.argtypes, self._set.restype = (ctypes.c_int,), None
        self._read = library.vlmtrace_heap_by_stage
        self._read.argtypes, self._read.restype = (ctypes.POINTER(ctypes.c_int64), ctypes.c_int), None
        self._numbers = {stage: number for number, stage in enumerate(sc.HEAP_STAGE_TAGS)}
        self._current = threading.local()  # the number this thread's allocations are charged to

    def enter(self, stage: str | None) -> int:
        """Charge this thread's allocations to `stage` (a stage the counter does not number: to none) from
        now on; the number they were charged to until now, for `restore`."""
        previous = getattr(self._current, "number", 0)
        self.restore(self._numbers.get(stage, 0))
        return previous

    def restore(self, number: int) -> None:
        self._current.number = number
        self._set(number)

    def read(self) -> dict[str, int]:
        """The bytes of each stage holding any, under sc.HEAP_BY_STAGE_KEYS."""
        values = (ctypes.c_int64 * len(sc.HEAP_STAGE_TAGS))()
        self._read(values, len(values))
        return {key: value for key, value in zip(sc.HEAP_BY_STAGE_KEYS, values) if value}


def stage_tags() -> StageTags | None:
    """The counter's stage charges, or None where this process was started without it."""
    try:
        library = ctypes.PyDLL(None)
    except OSError:
        return None
    return StageTags(library) if hasattr(library, "vlmtrace_heap_by_stage") else None


if __name__ == "__main__":  # `LD_PRELOAD=$(python -m vlmtrace.probes.heap) program`, where `vlmtrace run` cannot start it
    print(build())
