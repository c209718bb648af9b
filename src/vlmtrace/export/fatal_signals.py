"""Who handles the fatal signals: libc's `sigaction`, read and written as raw `struct sigaction` bytes.

A native library may install its own handler for a fatal signal after faulthandler armed it (once
LMDeploy's TurboMind engine is up, SIGABRT's handler is TurboMind's). These functions tell which
handler is installed and where it lives; journal/stacks.py puts the guard and faulthandler back in
front of such a library, so that the stacks are written and the library's handler still runs after.
Only ever called from Python threads, never from a signal handler.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Iterable

FATAL_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS", "SIGILL") if hasattr(signal, name)
)
_ACTION_BYTES = 256  # more than any libc's `struct sigaction`, whose first member is the handler


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


@functools.cache
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigaction.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    libc.sigaction.restype = ctypes.c_int
    libc.dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
    libc.dladdr.restype = ctypes.c_int
    return libc


def installed() -> dict[int, ctypes.Array]:
    """The installed action of every fatal signal, as libc's raw `struct sigaction`; empty off Linux."""
    libc = _libc()
    if libc is None:
        return {}
    actions = {}
    for signum in FATAL_SIGNALS:
        action = ctypes.create_string_buffer(_ACTION_BYTES)
        if libc.sigaction(signum, None, action) == 0:
            actions[signum] = action
    return actions


def handler_of(action: ctypes.Array) -> int:
    return ctypes.c_void_p.from_buffer(action).value or 0


def taken_over(armed: dict[int, ctypes.Array]) -> dict[int, ctypes.Array]:
    """The signals whose handler is no longer the one installed when `armed` was read, with their new action."""
    now = installed()
    return {
        signum: action
        for signum, action in now.items()
        if signum in armed and handler_of(action) != handler_of(armed[signum])
    }


def install(actions: dict[int, ctypes.Array]) -> None:
    libc = _libc()
    for signum, action in actions.items():
        libc.sigaction(signum, action, None)


def names(signums: Iterable[int]) -> str:
    return ", ".join(signal.Signals(signum).name for signum in signums)


def owners(actions: dict[int, ctypes.Array]) -> str:
    """Which library (and function, where its symbols say) each action's handler lives in: who took the
    signals over, for the warning that says so."""
    libc = _libc()
    found = []
    for handler in dict.fromkeys(handler_of(action) for action in actions.values()):
        info = _DlInfo()
        if libc is None or handler < 4096 or not libc.dladdr(handler, ctypes.byref(info)) or not info.dli_fname:
            found.append(hex(handler))
            continue
        where = os.path.basename(info.dli_fname.decode(errors="replace"))
        found.append(f"{where} ({info.dli_sname.decode(errors='replace')})" if info.dli_sname else where)
    return ", ".join(found)
