"""Heap bytes in use (malloc's chunks), where the process was started with heap_counter.c preloaded.

Resident pages place a host leak where the heap next needs fresh pages, not where the memory is kept
(docs/analysis.md, "Host memory at span boundaries"). The preloaded counter changes where malloc and free
are called, so span boundaries can place it; a read is ~0.3 µs. It is built with the wheel (setup.py,
`vlmtrace/probes/_heap_counter*.so`, a plain shared library) and can only be loaded at a process's start
(`LD_PRELOAD`): `vlmtrace run --heap-counter` sets `LD_PRELOAD` for the program and every process it
starts. In a process without it, `in_use_reader()` is None and readings carry no heap key.

The counter also charges large chunks to the stage whose work allocated them (`StageTags`): span
boundaries tell it each thread's stage, the sampler reads the charges (docs/analysis.md, "Large chunks
charged to the stage that allocated them").
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import ctypes
import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import wrapt

from vlmtrace import semconv as sc

SYMBOL = "vlmtrace_heap_in_use"
LOAD_CHECK_TIMEOUT_S = 60
# Seconds between two readings of what each stage kept by when it was allocated (`StageTags.survivors`), and one
# more at shutdown: a few KB each, where the charges by stage are a few numbers in every sample.
SURVIVORS_EVERY_S = 10


class HeapCounterUnavailable(RuntimeError):
    """The counter is not in this installation, or does not load here: the message says why."""


def library_path() -> Path | None:
    """The counter built with the wheel, or None where this installation has none (no compiler at install
    time, a platform other than Linux)."""
    spec = importlib.util.find_spec("vlmtrace.probes._heap_counter")
    return Path(spec.origin) if spec is not None and spec.origin else None


def _check_loads(library: str) -> None:
    """A program started with it preloaded must run: where the C library is not glibc (no `__libc_malloc`),
    the loader would refuse it and the user's program would not start at all."""
    done = subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.PyDLL(None).{SYMBOL}()"],
        env={**os.environ, "LD_PRELOAD": library},
        capture_output=True,
        text=True,
        timeout=LOAD_CHECK_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise HeapCounterUnavailable(f"the heap counter does not load here (glibc only): {last}")


def library() -> Path:
    """The counter to preload, once a process started with it has run here."""
    path = library_path()
    if path is None:
        raise HeapCounterUnavailable(
            "this installation of vlmtrace has no heap counter (it is built with the "
            "wheel on Linux; reinstall from the sdist where a C compiler is installed)"
        )
    try:
        _check_loads(str(path))
    except (OSError, subprocess.SubprocessError) as error:
        raise HeapCounterUnavailable(f"the heap counter cannot be checked: {error}") from error
    return path


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


class ChargedJob:
    """A job that tells the counter its submitter's stage while it runs (StageTags.submitted)."""

    __slots__ = ("fn", "number", "tags")

    def __init__(self, fn: Callable, number: int, tags: StageTags) -> None:
        self.fn = fn
        self.number = number
        self.tags = tags

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.tags.charged_to(self.number):
            return self.fn(*args, **kwargs)


class StageTags:
    """The preloaded counter's large chunks, charged to the stage whose work allocated them until they are
    freed, wherever that happens (heap_counter.c). The counter knows a stage per thread; the work knows it
    per context: span boundaries set it in a context variable, so an asyncio task or an executor job has
    its own, and the counter is told it where the work starts running on a thread: each step of a task
    (`carry_tasks`) and each executor job (`submitted`)."""

    def __init__(self, library: ctypes.PyDLL) -> None:
        self._slot_address = library.vlmtrace_heap_stage_slot
        self._slot_address.argtypes, self._slot_address.restype = (), ctypes.c_void_p
        self._read = library.vlmtrace_heap_by_stage
        self._read.argtypes, self._read.restype = (ctypes.POINTER(ctypes.c_int64), ctypes.c_int), None
        # None where the preloaded counter predates the survivors' read (a library preloaded by hand, kept across an upgrade)
        self._read_survivors = getattr(library, "vlmtrace_heap_survivors", None)
        self._survivor_intervals = 0
        if self._read_survivors is not None:
            self._read_survivors.argtypes = (
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int64),
            )
            self._read_survivors.restype = None
            meta = (ctypes.c_int64 * 3)()
            self._read_survivors(None, 0, meta)  # no rows: the interval count, the counter's BUCKETS
            self._survivor_intervals = meta[2]
        self._numbers = {stage: number for number, stage in enumerate(sc.HEAP_STAGE_TAGS)}
        self._stage: contextvars.ContextVar[int] = contextvars.ContextVar("vlmtrace_heap_stage", default=0)
        self._thread = threading.local()  # `slot`: this thread's stage in the counter, as a ctypes int
        self._carrying = False
        self._patched_loops: list[tuple[type, str, Callable | None]] = []  # (loop class, method, its own or None)
        self._uvloop_hooked = False

    def enter(self, stage: str | None) -> int:
        """Charge this context's allocations to `stage` (a stage the counter does not number: to none) from
        now on; the number they were charged to until now, for `restore`."""
        previous = self._stage.get()
        self.restore(self._numbers.get(stage, 0))
        return previous

    def restore(self, number: int) -> None:
        self._stage.set(number)
        self.slot().value = number

    def stage_number(self) -> int:
        """The number of the stage the running context works in (0: none)."""
        return self._stage.get()

    @contextlib.contextmanager
    def charged_to(self, number: int) -> Iterator[None]:
        """This thread's allocations are charged to `number` inside the block, as before it after."""
        slot = self.slot()
        previous = slot.value
        slot.value = number
        try:
            yield
        finally:
            slot.value = previous

    def slot(self) -> ctypes.c_int:
        """The stage the counter charges this thread's allocations to, as an int to read and set (a number
        of `self._numbers`, 0 for none): the counter's own thread-local variable, seen through ctypes."""
        try:
            return self._thread.slot
        except AttributeError:
            slot = self._thread.slot = ctypes.c_int.from_address(self._slot_address())
            return slot

    def submitted(self, fn: Callable) -> Callable:
        """`fn`, charging what it allocates to the stage of the context submitting it now, whatever thread
        runs it later and in whatever context (`run_in_executor` runs its jobs outside their submitter's).
        A job charged already stays as it is: the image encoder's executor gets its jobs through the loop's
        `run_in_executor`, and both charge what they are handed."""
        if type(fn) is ChargedJob:
            return fn
        return ChargedJob(fn, self._stage.get(), self)

    def carry_tasks(self) -> None:
        """Every asyncio task created from now on tells the counter its context's stage at each step (on an
        event loop, other requests' tasks run between two steps of one), and every job handed to an executor
        through the loop (`run_in_executor`: LMDeploy decodes a request's images on the default executor) the
        stage it was submitted from. Asyncio's own loops and uvloop's (which uvicorn picks where it is
        installed; carried once it is imported). Undone by `stop_carrying_tasks`."""
        if self._carrying:
            return
        self._carrying = True
        self._carry(asyncio.BaseEventLoop)
        if not self._uvloop_hooked:  # wrapt runs the hook now if uvloop is imported already
            self._uvloop_hooked = True
            wrapt.register_post_import_hook(self._carry_uvloop, "uvloop")

    def _carry_uvloop(self, uvloop: ModuleType) -> None:
        if self._carrying:
            self._carry(uvloop.Loop)

    def _carry(self, loop_class: type[asyncio.AbstractEventLoop]) -> None:
        """`loop_class.create_task` wraps each task's coroutine, `run_in_executor` each job. uvloop's `Loop` is
        a Python class over its compiled loop: a method set on it is found before the compiled one, by
        uvloop's own calls too."""
        if any(patched is loop_class for patched, _, _ in self._patched_loops):
            return
        create_task, run_in_executor, tags = loop_class.create_task, loop_class.run_in_executor, self

        def create_carried_task(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
            return create_task(loop, _CarriedCoroutine(coro, tags) if asyncio.iscoroutine(coro) else coro, **kwargs)

        def run_carried_in_executor(loop: asyncio.AbstractEventLoop, executor: Any, func: Callable, *args: Any) -> Any:
            return run_in_executor(loop, executor, tags.submitted(func), *args)

        for name, method in (("create_task", create_carried_task), ("run_in_executor", run_carried_in_executor)):
            self._patched_loops.append((loop_class, name, loop_class.__dict__.get(name)))
            setattr(loop_class, name, method)

    def stop_carrying_tasks(self) -> None:
        self._carrying = False
        for loop_class, name, own in reversed(self._patched_loops):
            if own is None:
                delattr(loop_class, name)  # it was inherited: the compiled loop's own again
            else:
                setattr(loop_class, name, own)
        self._patched_loops.clear()

    def read(self) -> dict[str, tuple[int, ...]]:
        """Each stage's bytes, in sc.HEAP_STAGE_TAGS's order, under sc.MEM_HOST_HEAP_BY_STAGE."""
        values = (ctypes.c_int64 * len(sc.HEAP_STAGE_TAGS))()
        self._read(values, len(values))
        return {sc.MEM_HOST_HEAP_BY_STAGE: tuple(values)}

    def survivors(self) -> dict[str, dict[str, Any]]:
        """The chunks still in use by allocating stage and by when they were allocated, under
        sc.MEM_HOST_HEAP_SURVIVORS (docs/schema.md); nothing before the first large chunk, or from a counter
        that does not keep them."""
        if self._read_survivors is None:
            return {}
        meta = (ctypes.c_int64 * 3)()
        stages, intervals = len(sc.HEAP_STAGE_TAGS), self._survivor_intervals
        values = (ctypes.c_int64 * (stages * intervals))()
        self._read_survivors(values, stages, meta)
        if meta[0] < 0:
            return {}
        rows = [values[stage * intervals : (stage + 1) * intervals] for stage in range(stages)]
        return {
            sc.MEM_HOST_HEAP_SURVIVORS: {
                "origin_ms": meta[0],
                "width_ms": meta[1],
                "bytes": [row if any(row) else [] for row in rows],
            }
        }


class _CarriedCoroutine(collections.abc.Coroutine):
    """A task's coroutine that tells the counter the task's stage at each step: asyncio runs every step
    (`send`, `throw`) in the task's own context."""

    __slots__ = ("_coro", "_tags")

    def __init__(self, coro: Any, tags: StageTags) -> None:
        self._coro = coro
        self._tags = tags

    def send(self, value: Any) -> Any:
        """A step: the task's stage while it runs, then the thread's own again (between two steps the loop
        runs callbacks that belong to no task, charged as the thread was before). Every step of every task
        comes here: `charged_to`, written out."""
        tags = self._tags
        slot = tags.slot()
        previous = slot.value
        slot.value = tags._stage.get()
        try:
            return self._coro.send(value)
        finally:
            slot.value = previous

    def throw(self, *args: Any) -> Any:
        with self._tags.charged_to(self._tags.stage_number()):
            return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Any:
        return self._coro.__await__()

    def __getattr__(self, name: str) -> Any:  # cr_frame, __qualname__...: asyncio's reprs and debug mode read them
        return getattr(self._coro, name)


def stage_tags() -> StageTags | None:
    """The counter's stage charges, or None where this process was started without it."""
    try:
        library = ctypes.PyDLL(None)
    except OSError:
        return None
    return StageTags(library) if hasattr(library, "vlmtrace_heap_stage_slot") else None


if (
    __name__ == "__main__"
):  # `LD_PRELOAD=$(python -m vlmtrace.probes.heap) program`, where `vlmtrace run` cannot start it
    print(library())
