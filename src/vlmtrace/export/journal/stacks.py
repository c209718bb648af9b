"""Python's stacks at a fatal signal, written into the journal by faulthandler (docs/journal.md, Fatal signals).

faulthandler reports into one file per process, so the open journals form a chain: the newest holds
faulthandler and hands it back to the previous one when it closes.
"""

from __future__ import annotations

import faulthandler
import logging
import threading
from collections.abc import Callable

from vlmtrace.export import fatal_signals

_log = logging.getLogger("vlmtrace")

_lock = threading.Lock()
_holder: FatalStacks | None = None


class FatalStacks:
    """faulthandler armed on one journal's descriptor (all threads), kept in front of native handlers."""

    def __init__(self, fd: int, warn: Callable[[str, str], None]) -> None:
        self._fd = fd
        self._warn = warn
        self._actions: dict = {}
        self._previous: FatalStacks | None = None
        self._released = False
        self.checking = True

    def arm(self) -> None:
        """Send fatal-signal stacks into this journal, unless the application set up faulthandler itself."""
        global _holder
        with _lock:
            if _holder is None and faulthandler.is_enabled():
                message = ("faulthandler was already enabled by the application; fatal-signal stacks go to its file, "
                           "not to the journal")
                _log.warning("vlmtrace: %s", message)
                self._warn("faulthandler", message)
                return
            self._previous = _holder
            faulthandler.enable(file=self._fd, all_threads=True)
            self._actions = fatal_signals.installed()
            _holder = self

    def reclaim(self) -> None:
        """Put faulthandler back in front of a fatal-signal handler that a native library installed after it.

        TurboMind replaces SIGABRT's handler while serving, not at start-up, so this runs with every
        maintenance step (five `sigaction` calls, off the request path); the library's handler still
        runs after the stacks are written.
        """
        if not self.checking:
            return
        with _lock:
            if _holder is not self or self._released:
                return
            try:
                taken = fatal_signals.taken_over(self._actions)
                if not taken:
                    return
                faulthandler.disable()
                fatal_signals.install(taken)
                faulthandler.enable(file=self._fd, all_threads=True)
                self._actions = fatal_signals.installed()
            except Exception as error:  # noqa: BLE001 - the stacks are a bonus, the service must go on
                self.checking = False
                self._warn("faulthandler", f"cannot check the fatal-signal handlers ({type(error).__name__}: {error})")
                return
        message = (f"the handler for {fatal_signals.names(taken)} was replaced after vlmtrace armed faulthandler "
                   f"(by {fatal_signals.owners(taken)}); faulthandler is back in front and calls it after the stacks")
        _log.info("vlmtrace: %s", message)
        self._warn("faulthandler", message)

    def release(self) -> None:
        """Hand faulthandler back to the previous open journal, or disable it if this one had enabled it."""
        global _holder
        with _lock:
            self._released = True
            if _holder is not self:
                return
            previous = self._previous
            while previous is not None and previous._released:
                previous = previous._previous
            if previous is None:
                faulthandler.disable()
            else:
                faulthandler.enable(file=previous._fd, all_threads=True)
            _holder = previous
