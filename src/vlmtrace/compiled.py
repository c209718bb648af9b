"""The compiled core, `vlmtrace._core`: built with the wheel (setup.py), or by `pip install` from the sdist
with the platform's C compiler. Nothing of vlmtrace runs a compiler inside the process it records. Where
the core is missing (an install without a compiler, a platform other than Linux), one warning says what
that costs, and the Python path runs."""

from __future__ import annotations

import functools
import logging
from types import ModuleType

_log = logging.getLogger(__name__)

MISSING_COST = (
    "fatal signals are not guarded against a native handler that hangs (a crash can keep a dying "
    "process alive), and span boundaries read host memory through ctypes (~6 µs more a reading)"
)


@functools.cache
def core() -> ModuleType | None:
    """The loaded core, or None (said once, as a warning)."""
    try:
        from vlmtrace import _core
    except ImportError as error:
        _log.warning(
            "vlmtrace: the compiled core is missing (%s): %s; reinstall vlmtrace from its wheel, or "
            "from the sdist where a C compiler is installed",
            error,
            MISSING_COST,
        )
        return None
    return _core
