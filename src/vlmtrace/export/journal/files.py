"""Where a process's journal files go, and how they are created.

Journal files can hold the command line, resource attributes and (with `capture_content`) prompts,
under names anyone can predict (host, pid, start second). So they are created owner-only whatever
the umask (files 0600, the directories we create 0700), never through a symbolic link at the final
name (`O_NOFOLLOW`), new names with `O_EXCL` (nobody can plant a file there first), and only regular
files are written (not a FIFO or a device put at a file target's name).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
import sys

from vlmtrace.export.journal.tail import DiskFull

if sys.platform != "win32":  # Windows has no advisory locks: a file target is then shared by whoever names it
    import fcntl

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
_FILE_TARGET = re.compile(r"^(?P<base>.*\.jsonl)(?:\.(?P<seq>\d+))?$")
_BASE_FLAGS = os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
MAX_SKIPPED = 64  # files held by another process (or names taken) skipped before giving up a rotation


class FileNames:
    """The file for each sequence number of one process's journal."""

    def __init__(self, target: str, pid: int, start_s: int) -> None:
        match = _FILE_TARGET.match(target)
        self.directory: str | None = None if match else target
        if match:
            self._base = match["base"]
            self.first_seq = int(match["seq"] or 0)
        else:
            self._base = os.path.join(target, f"vlmtrace-{_hostname()}-{pid}-{start_s}")
            self.first_seq = 0
        self._pid = pid

    def path(self, seq: int) -> str:
        if self.directory is not None:
            return f"{self._base}.{seq}.jsonl"
        return self._base if seq == 0 else f"{self._base}.{seq}"

    def may_append(self) -> bool:
        """A file target appends to a file that exists (a new header marks the new run); a directory
        target's names are this process's alone, so one that exists is someone else's."""
        return self.directory is None

    def for_this_process_only(self) -> None:
        """A file target held by another live process: this one writes `<stem>-<pid>.jsonl` beside it."""
        self._base = f"{self._base[: -len('.jsonl')]}-{self._pid}.jsonl"
        self.first_seq = 0

    def make_directory(self) -> None:
        make_private_directories(
            self.directory if self.directory is not None else os.path.dirname(self.path(self.first_seq))
        )


def _hostname() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


def make_private_directories(path: str) -> None:
    """Create `path` and any missing parent 0700 (`os.makedirs` gives the parents the umask's mode)."""
    if not path or os.path.isdir(path):
        return
    make_private_directories(os.path.dirname(path))
    try:
        os.mkdir(path, DIRECTORY_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def open_locked(names: FileNames, seq: int, skip: bool) -> tuple[int, str, int] | None:
    """Open file `seq` (with `skip`, the next one that is free) and lock it; None if it is held or taken."""
    for candidate in range(seq, seq + (MAX_SKIPPED if skip else 1)):
        path = names.path(candidate)
        fd = _open_file(path, names.may_append())
        if fd is None:
            continue
        if _try_lock(fd):
            return fd, path, candidate
        os.close(fd)
    return None


def open_first(names: FileNames, target: str) -> tuple[int, str, int]:
    """The first file of a process, opened and locked: a directory's next free name, or a file target
    (beside it, `<stem>-<pid>.jsonl`, where another live process holds it)."""
    names.make_directory()
    opened = open_locked(names, names.first_seq, skip=names.directory is not None)
    if opened is None and names.directory is None:
        names.for_this_process_only()
        opened = open_locked(names, names.first_seq, skip=False)
    if opened is None:
        raise OSError(f"the journal file for {target} is held by another process")
    return opened


def write_header(fd: int, header: bytes) -> int:
    """Write a file's header line at its end; returns the file's size after it. Raises DiskFull where it
    does not fit, leaving the file as it was."""
    existing = os.fstat(fd).st_size
    written = os.write(fd, header)
    if written < len(header):
        os.ftruncate(fd, existing)
        raise DiskFull(errno.ENOSPC, "no space left for the journal's header")
    return existing + written


def _open_file(path: str, may_append: bool) -> int | None:
    """The descriptor of a new file at `path`, or of the regular file there when `may_append`; None when
    the name is taken by something this journal must not write."""
    try:
        fd = os.open(path, _BASE_FLAGS | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        if not may_append:
            return None
        try:
            fd = os.open(path, _BASE_FLAGS)
        except OSError as error:
            if error.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
                raise OSError(errno.ELOOP, "the journal file is a symbolic link; not followed", path) from None
            raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "the journal path is not a regular file", path)
    return fd


def _try_lock(fd: int) -> bool:
    """Take an advisory lock that lives as long as this process holds the file open."""
    if sys.platform == "win32":
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # the filesystem has no flock (some network mounts): do without
    return True


def remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def park_descriptor(fd: int) -> None:
    """Point the descriptor number at /dev/null instead of closing it: a thread that raced the journal's
    close may still write to this number; closed, the number could be reused by another file of the
    application and receive a journal line."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.dup2(devnull, fd, inheritable=False)
        finally:
            os.close(devnull)
    except OSError:
        os.close(fd)
