"""The fatal-signal guard (fatal_guard.c, in the compiled core `vlmtrace._core`): the first handler of every
fatal signal, in C, that bounds the chain behind it (faulthandler, then the default action or a native
library's handler) and ends the process with the signal's default action if that chain has not finished
within BOUND_MS.

The core is built with the wheel (compiled.py). Where it is missing, or off Linux, there is no guard:
faulthandler alone handles the signals, and is not put back in front of a library that takes them over
(docs/journal.md, Fatal signals).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from types import ModuleType

from vlmtrace import compiled

BOUND_MS = 1500  # the chain's longest time: a process that aborts is gone within 2 s


class Guard:
    """The guard's calls into the core."""

    def __init__(self, core: ModuleType) -> None:
        self._core = core
        core.guard_set_bound_ms(BOUND_MS)
        self.address: int = core.guard_address()

    def front(self, signums: Iterable[int]) -> None:
        """Put the guard in front of what is installed now for each signal (OSError where one cannot be)."""
        for signum in signums:
            self._core.guard_front(signum)

    def behind_installed(self, signums: Iterable[int]) -> None:
        """Pass each signal on to what is installed now (where the guard is no longer in front of it)."""
        for signum in signums:
            self._core.guard_behind_installed(signum)

    def terminating(self, signum: int, bound_s: float) -> None:
        """Bound a terminating signal's end: put a C handler in front of Python's for `signum` that arms a
        timer; the process ends by the signal's default action `bound_s` after it, if it has not by then."""
        self._core.guard_terminating(signum, max(1, int(bound_s * 1000)))

    def dying(self) -> bool:
        """A fatal signal's chain is running: handlers change because the process is dying."""
        return self._core.guard_dying()


@functools.cache
def guard() -> Guard | None:
    """The guard, from the compiled core; None where the core is missing (compiled.py warns once)."""
    core = compiled.core()
    return Guard(core) if core is not None else None
