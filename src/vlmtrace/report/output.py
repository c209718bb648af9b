"""Writing what a command produces (the HTML report, its JSON summary) whole or not at all, without
ever destroying what the output path names.

A regular file (or a path not there yet) is written to a temporary file beside it, then renamed over
it: a report interrupted while it is written (a full disk, Ctrl-C, SIGTERM from a CI job's timeout)
leaves the previous file, if any, and never half a page that a browser would show as if it were
complete. A symbolic link stays a link: the file it points to is the one replaced. A character device
(`/dev/null`, a terminal) and a FIFO with a reader (`-o >(gzip > r.gz)`) are written through in place,
never replaced by a file; a block device, a socket, a directory and a FIFO nobody reads are refused.
A temporary file left by a killed report (SIGKILL runs no handler) is removed by the next report
written beside it. Errors name the path the user gave, never the temporary one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

PARTIAL_SUFFIX = ".partial"
_PARTIAL_OWNER = re.compile(r"\.vlmtrace-(\d+)-")
_WRITTEN_IN_PLACE = ("/dev/", "/proc/")


class OutputRefused(OSError):
    """The output path names something a report must not be written to (a block device, a directory…)."""


def same_file(first: str | Path, second: str | Path) -> bool:
    """Whether two output paths name one file (a character device such as /dev/null excepted: writing
    it twice loses nothing)."""
    try:
        if stat.S_ISCHR(os.stat(first).st_mode):
            return False
        return os.path.samefile(first, second)
    except OSError:
        return os.path.realpath(first) == os.path.realpath(second)


def replace_file(path: str | Path, data: str | bytes) -> None:
    """Write `data` to `path`: atomically for a regular file or a new path, through the link for a
    symbolic link, in place for a character device or a read FIFO; OSError (naming `path`) otherwise."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    shown = str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise OSError(error.errno, error.strerror, shown) from None
    if mode is not None and not stat.S_ISREG(mode):
        _write_in_place(shown, mode, payload)
    elif mode is not None and os.path.islink(shown) and os.path.abspath(shown).startswith(_WRITTEN_IN_PLACE):
        _write_in_place(shown, mode, payload)  # /dev/stdout redirected to a file: the shell's own file, truncated
    else:
        _replace(Path(os.path.realpath(path)), shown, payload)


def _write_in_place(shown: str, mode: int, payload: bytes) -> None:
    if stat.S_ISDIR(mode):
        raise OutputRefused(errno.EISDIR, "a directory, not a file", shown)
    if stat.S_ISBLK(mode):
        raise OutputRefused(errno.EPERM, "a block device: a report is never written over a disk", shown)
    if stat.S_ISSOCK(mode):
        raise OutputRefused(errno.EPERM, "a socket, not a file", shown)
    flags = os.O_WRONLY | os.O_NOCTTY | (os.O_TRUNC if stat.S_ISREG(mode) else 0)
    try:
        descriptor = os.open(shown, flags | (os.O_NONBLOCK if stat.S_ISFIFO(mode) else 0))
    except OSError as error:
        if error.errno == errno.ENXIO:
            raise OutputRefused(errno.ENXIO, "a FIFO that nothing reads", shown) from None
        raise OSError(error.errno, error.strerror, shown) from None
    try:
        if stat.S_ISFIFO(mode):
            fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        with os.fdopen(descriptor, "wb", closefd=False) as stream:
            stream.write(payload)
    except OSError as error:
        raise OSError(error.errno, error.strerror, shown) from None
    finally:
        os.close(descriptor)


def _replace(target: Path, shown: str, payload: bytes) -> None:
    prefix = f".{target.name}.vlmtrace-{os.getpid()}-"
    _remove_stale_partials(target)
    partial = None
    try:
        with _signals_raise():
            descriptor, partial = tempfile.mkstemp(dir=target.parent, prefix=prefix, suffix=PARTIAL_SUFFIX)
            with os.fdopen(descriptor, "wb") as stream:
                stream.write(payload)
            os.chmod(partial, 0o666 & ~_umask())
            os.replace(partial, target)
            partial = None
    except OSError as error:
        raise OSError(error.errno, error.strerror, shown) from None
    finally:
        if partial is not None and os.path.exists(partial):
            os.unlink(partial)


def _remove_stale_partials(target: Path) -> None:
    """Temporary files beside `target` whose writer is gone (a report killed with SIGKILL)."""
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    for name in names:
        if not (name.startswith(f".{target.name}.vlmtrace-") and name.endswith(PARTIAL_SUFFIX)):
            continue
        owner = _PARTIAL_OWNER.search(name[len(target.name) + 1 :])
        if owner is None or _alive(int(owner.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(target.parent / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While a temporary file exists, SIGTERM and SIGHUP raise SystemExit (so it is removed) instead
    of ending the process where it stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {number: signal.signal(number, leave) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _umask() -> int:
    """The process's umask (read by setting it: there is no other way), so the file gets the mode a
    plain open() would have given it, not mkstemp's 0600."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
