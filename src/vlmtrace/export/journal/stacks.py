"""What the journal does at a fatal signal (docs/journal.md, Fatal signals): Python's stacks, written by
faulthandler, and the records still waiting to be written, flushed by a handler behind it.

faulthandler reports into one file per process, so the open journals form a chain: the newest holds
faulthandler and hands it back to the previous one when it closes. The chain of handlers for each
fatal signal is: faulthandler (writes the stacks), then the flush handler (writes the holder's
pending records), then whatever was installed before (the default action, or a native library's).
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
_flush_handler = None  # the C function pointer of `_flush_at_fatal_signal` while installed
_behind_flush: dict = {}  # per signal, the action the flush handler passes the signal on to


def _flush_at_fatal_signal(signum: int) -> None:
    """Runs in the dying thread, after faulthandler wrote the stacks, with the GIL: ctypes takes it (a thread
    without it, such as a native library's, waits for it; Python threads give it up within the switch
    interval). Then the signal goes on to what was installed before."""
    holder = _holder
    try:
        if holder is not None and holder._flush is not None:
            holder._flush()
    except BaseException:  # noqa: BLE001 - the process is dying: the signal must go on whatever happened
        pass
    fatal_signals.raise_again(signum, _behind_flush[signum])


class FatalStacks:
    """faulthandler armed on one journal's descriptor (all threads), kept in front of native handlers."""

    def __init__(self, fd: int, warn: Callable[[str, str], None], flush: Callable[[], None] | None = None) -> None:
        """`flush`: writes the journal's pending records at a fatal signal, without waiting on a lock for
        long (the dying thread may hold one); None where records are never pending."""
        self._fd = fd
        self._warn = warn
        self._flush = flush
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
            if self._flush is not None and _flush_handler is None:
                _install_flush_handler(fatal_signals.installed())
            faulthandler.enable(file=self._fd, all_threads=True)
            self._actions = fatal_signals.installed()
            _holder = self

    def reclaim(self) -> None:
        """Put faulthandler (and the flush handler) back in front of a fatal-signal handler that a native
        library installed after them.

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
                if _flush_handler is not None:
                    _install_flush_handler(taken)
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
        """Hand faulthandler back to the previous open journal, or disable it (and the flush handler) if this
        was the last."""
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
                _remove_flush_handler()
            else:
                faulthandler.enable(file=previous._fd, all_threads=True)
            _holder = previous


def _install_flush_handler(behind: dict) -> None:
    """Put the flush handler in front of the actions in `behind` (signal → the action installed now)."""
    global _flush_handler
    if _flush_handler is None:
        _flush_handler = fatal_signals.python_handler(_flush_at_fatal_signal)
        if _flush_handler is None:
            return
    _behind_flush.update(behind)
    fatal_signals.install_handler(_flush_handler, behind)


def _remove_flush_handler() -> None:
    global _flush_handler
    if _flush_handler is not None:
        fatal_signals.install(dict(_behind_flush))
        _behind_flush.clear()
        _flush_handler = None
