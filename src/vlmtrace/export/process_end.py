"""How the process ends, for the journal's end record (docs/journal.md, "How a process ended").

A terminating signal whose action is the default (SIGTERM and SIGHUP, and SIGINT where Python's own
handler is off) ends the process without running atexit, so without an end record. While a journal is
open, vlmtrace handles such a signal in Python: it closes the journals (their end record names the
signal), then the exports, all within the shutdown timeout, from a thread of its own (the interrupted
thread may hold a lock they need); then it puts the default action back and raises the signal again,
so the process dies by it as it would have. Python runs that handler only once the main thread runs
Python again: where the compiled core is installed, its fatal-signal guard (fatal_guard.py) also bounds that
wait, ending the process by the signal's default action if it has not ended within the shutdown timeout and 1 s. Python's own SIGINT handler is kept and called, behind one
that notes the signal: the KeyboardInterrupt comes as before, and a process that then ends (LMDeploy's
api_server exits 0) says SIGINT ended it. A handler the application installs later replaces ours and
is in charge; one that puts ours back and raises the signal again when its own shutdown is done
(uvicorn's) reaches it.

`ended_by()` is what the end record says: the terminating signal seen; "SIGINT" where an uncaught
KeyboardInterrupt ended the process; "uncaught NAME" for another uncaught exception; None for a plain exit.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import types
import weakref
from collections.abc import Callable

from vlmtrace.export import fatal_guard

_log = logging.getLogger(__name__)

TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))
MAIN_THREAD_WAIT_S = 1.0  # beyond the shutdown timeout, for the main thread to come back from a native call

_closers: list[weakref.WeakMethod] = []
_timeout_s = 0.0
_received: str | None = None


def watch(close: Callable[[], None], timeout_s: float = 0.0) -> None:
    """Call the bound method `close` when a terminating signal is about to end the process, in the order
    watched (journals first: they are local and quick), all within the longest `timeout_s` given."""
    global _timeout_s
    _closers.append(weakref.WeakMethod(close))
    _timeout_s = max(_timeout_s, timeout_s)
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set signal handlers; atexit still writes the end record
    for signum in TERMINATING:
        try:
            installed = signal.getsignal(signum)
            if installed is signal.SIG_DFL:
                signal.signal(signum, _on_terminating_signal)
                installed = _on_terminating_signal
            if installed is _on_terminating_signal:
                guard = fatal_guard.guard()
                if guard is not None:
                    guard.terminating(signum, _timeout_s + MAIN_THREAD_WAIT_S)
            elif installed is signal.default_int_handler:
                signal.signal(signum, _note_interrupt)
        except (OSError, ValueError, RuntimeError):
            continue


def ended_by() -> str | None:
    if _received is not None:
        return _received
    last = getattr(sys, "last_exc", None)  # an uncaught exception, set before atexit runs
    last_type = type(last) if last is not None else getattr(sys, "last_type", None)
    if last_type is None:
        return None
    return "SIGINT" if issubclass(last_type, KeyboardInterrupt) else f"uncaught {last_type.__name__}"


def _close_all() -> None:
    for weak in _closers:
        close = weak()
        if close is None:
            continue
        try:
            close()
        except Exception:  # noqa: BLE001 - the process is ending: whatever happens, the signal goes on
            _log.debug("vlmtrace: closing at a terminating signal failed", exc_info=True)


def _note_interrupt(signum: int, frame: types.FrameType | None) -> None:
    """SIGINT noted, then Python's own handler: KeyboardInterrupt, as without vlmtrace."""
    global _received
    _received = signal.Signals(signum).name
    signal.default_int_handler(signum, frame)


def _on_terminating_signal(signum: int, frame: types.FrameType | None) -> None:
    global _received
    _received = signal.Signals(signum).name
    closing = threading.Thread(target=_close_all, name="vlmtrace-end", daemon=True)
    closing.start()
    closing.join(_timeout_s or 1.0)
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
