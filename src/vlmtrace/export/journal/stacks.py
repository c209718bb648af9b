"""What the journal does at a fatal signal (docs/journal.md, Fatal signals): faulthandler writes Python's
stacks into it, behind the fatal-signal guard (fatal_guard.c), which bounds the chain and keeps it
from becoming a cycle.

Nothing of vlmtrace's runs in Python, takes a lock or allocates at a fatal signal: the handlers are
faulthandler's and the guard's, both C, both writing with `write(2)` and calling `sigaction` only.
Records still queued for the flushing thread at that moment (at most its interval's worth) are not
written; with `journal_sync` there are none.

faulthandler reports into one file per process, so the open journals form a chain: the newest holds
faulthandler and hands it back to the previous one when it closes. The chain of handlers for each
fatal signal is: the guard, faulthandler, then whatever was installed before (the default action, or
a native library's handler).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import threading
from collections.abc import Callable

from vlmtrace.export import fatal_guard, fatal_signals

_log = logging.getLogger(__name__)

_lock = threading.Lock()
_holder: FatalStacks | None = None
_guard: fatal_guard.Guard | None = None  # loaded, and in front of faulthandler while a journal holds it


class FatalStacks:
    """faulthandler armed on one journal's descriptor (all threads), with the guard in front of it."""

    def __init__(self, fd: int, warn: Callable[[str, str], None]) -> None:
        self._fd = fd
        self._warn = warn
        self._previous: FatalStacks | None = None
        self._released = False
        self.checking = True

    def arm(self) -> None:
        """Send fatal-signal stacks into this journal, unless the application set up faulthandler itself."""
        global _holder, _guard
        with _lock:
            if _holder is None and faulthandler.is_enabled():
                message = (
                    "faulthandler was already enabled by the application; fatal-signal stacks go to its file, "
                    "not to the journal"
                )
                _log.warning("vlmtrace: %s", message)
                self._warn("faulthandler", message)
                return
            first = _holder is None
            self._previous = _holder
            faulthandler.enable(file=self._fd, all_threads=True)  # already enabled: only the file changes
            _holder = self
            if first:
                _armed_front.clear()
                _armed_front.update(fatal_signals.installed())
                _guard = fatal_guard.guard()
                if _guard is not None:
                    _guard.front(fatal_signals.FATAL_SIGNALS)

    def reclaim(self) -> None:
        """Put the guard and faulthandler back in front of a fatal-signal handler that a native library
        installed after them; without the guard, say once that the library took the signals over.

        TurboMind replaces SIGABRT's handler while serving, not at start-up, so this runs with every
        maintenance step (five `sigaction` calls, off the request path); the library's handler still
        runs after the stacks are written. Handlers that change while a fatal signal's chain runs
        (faulthandler puts back what it chains to) are the process dying, not a library: left alone.
        """
        if not self.checking:
            return
        with _lock:
            if _holder is not self or self._released:
                return
            try:
                if _guard is None:
                    taken = fatal_signals.taken_over(_armed_front)
                    if taken:
                        self.checking = False
                elif _guard.dying():
                    return
                else:
                    taken = {
                        signum: action
                        for signum, action in fatal_signals.installed().items()
                        if fatal_signals.handler_of(action) != _guard.address
                    }
                    if taken:
                        faulthandler.disable()
                        fatal_signals.install(taken)
                        faulthandler.enable(file=self._fd, all_threads=True)
                        _guard.front(fatal_signals.FATAL_SIGNALS)
                if not taken:
                    return
            except Exception as error:  # noqa: BLE001 - the stacks are a bonus, the service must go on
                self.checking = False
                self._warn("faulthandler", f"cannot check the fatal-signal handlers ({type(error).__name__}: {error})")
                return
            guarded = _guard is not None
        owner = fatal_signals.owners(taken)
        if guarded:
            message = (
                f"the handler for {fatal_signals.names(taken)} was replaced after vlmtrace armed faulthandler "
                f"(by {owner}); faulthandler is back in front and calls it after the stacks"
            )
        else:
            message = (
                f"the handler for {fatal_signals.names(taken)} was replaced after vlmtrace armed faulthandler "
                f"(by {owner}); without the fatal-signal guard (no compiled core) it is left in front, "
                "so a fatal signal there may leave no stacks"
            )
        _log.info("vlmtrace: %s", message)
        self._warn("faulthandler", message)

    def release(self) -> None:
        """Hand faulthandler back to the previous open journal, or disable it if this was the last: the
        handlers installed before vlmtrace come back, and a library's installed after it stays in front."""
        global _holder
        with _lock:
            self._released = True
            if _holder is not self:
                return
            previous = self._previous
            while previous is not None and previous._released:
                previous = previous._previous
            _holder = previous
            if previous is not None:
                faulthandler.enable(file=previous._fd, all_threads=True)
                return
            now = fatal_signals.installed()
            faulthandler.disable()
            if _guard is not None:
                _guard.behind_installed(fatal_signals.FATAL_SIGNALS)  # whatever still reaches it passes on
                fatal_signals.install(
                    {
                        signum: action
                        for signum, action in now.items()
                        if fatal_signals.handler_of(action) != _guard.address
                    }
                )


_armed_front: dict = {}  # without the guard: the actions installed once faulthandler was armed


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
