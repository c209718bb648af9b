"""Which files are read, and how much of each: directories walked for trace files, special files
refused with what they are, and compressed input read only up to a bound (`ReadLimits`, budget.py),
so a small gzip bomb costs seconds, not the machine's memory.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import re
import stat
from collections.abc import Callable, Iterable
from typing import IO, Any

from vlmtrace.analysis.readers.budget import (  # ReadLimits and the bounds are this module's API too
    EXPANDED_BYTES_FLOOR,
    EXPANDED_BYTES_VARIABLE,
    EXPANSION_RATIO,
    InputTooLarge,
    ReadLimits,
)
from vlmtrace.analysis.readers.journal import rotation_order
from vlmtrace.analysis.trace_data import TraceData

GZIP_MAGIC = b"\x1f\x8b"
BUFFER_BYTES = 1 << 20
# A journal writer reserves and maps 1 MiB past its last record at a time (docs/journal.md): at most
# about that many zero bytes end a file it is writing, looked at from the end in steps.
RESERVED_TAIL_BYTES = 2 << 20
TAIL_STEP_BYTES = 64 * 1024
# Decompressed in small steps, so a cut-off gzip file loses only its last step.
GZIP_STEP_BYTES = 64 * 1024
TRACE_NAME = re.compile(r"\.(jsonl?|pickle|pkl)(\.\d+)?(\.gz)?$|\.gz$", re.IGNORECASE)


class Bounded(io.RawIOBase):
    """A stream that raises `InputTooLarge` (with `reason`) instead of yielding more than `limit` bytes."""

    def __init__(self, inner: IO[bytes], limit: int, reason: str) -> None:
        self._inner, self._left, self._reason = inner, limit, reason

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        count = self._inner.readinto(buffer)  # type: ignore[attr-defined]
        self._left -= count
        if self._left < 0:
            raise InputTooLarge(self._reason)
        return count

    def close(self) -> None:
        self._inner.close()
        super().close()


class AsOpened(io.FileIO):
    """A file read up to the size it had when it was opened: a journal its writer goes on appending to
    (or rotating) is read as it stood then, and the reading ends. The zero bytes at its end (a live
    writer's reserved, mapped space) are left out: the writer copies records into them while the file is
    read, and a line read across that copy would start with zeros and end mid-record. A gzip'ed file
    is read whole (its trailer may end in zeros)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "rb")
        size = os.fstat(self.fileno()).st_size
        self.compressed = os.pread(self.fileno(), len(GZIP_MAGIC), 0) == GZIP_MAGIC
        self.size = size if self.compressed else _written_end(self.fileno(), size)

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        left = self.size - self.tell()
        if left <= 0:
            return 0
        with memoryview(buffer) as view:
            return super().readinto(view[:left] if left < len(view) else view) or 0

    def read(self, size: int | None = -1) -> bytes:
        return self.readall() if size is None or size < 0 else super().read(min(size, max(0, self.size - self.tell())))

    def readall(self) -> bytes:
        return super().read(max(0, self.size - self.tell()))


def display_name(path: str) -> str:
    """The path as text that can be written anywhere: undecodable bytes of a file name become U+FFFD."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def unreadable_reason(path: str) -> str | None:
    """Why `path` is not a regular file that can be read (None when it is one)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symbolic link loop"
        if error.errno == errno.ENOENT:
            return "broken symbolic link" if os.path.islink(path) else "no such file"
        return f"cannot be read: {error.strerror or error}"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file: copy what it delivers into a file and name that"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return "not a regular file"
    return None


def expand(paths: Iterable[str], data: TraceData | None = None) -> list[str]:
    """Files named directly, plus the trace files inside named directories (rotated journals in
    sequence; a report written into the journal's directory is not read back as input). With `data`,
    a directory that holds no trace files and a subdirectory that cannot be listed are problems."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found: list[str] = []

            def unlisted(error: OSError, top: str = path) -> None:
                if data is not None:
                    name = display_name(error.filename or top)
                    data.problem(
                        name, None, f"directory cannot be listed ({error.strerror or error}); its files were not read"
                    )

            for root, dirs, names in os.walk(path, onerror=unlisted):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(
                    os.path.join(root, name) for name in names if not name.startswith(".") and TRACE_NAME.search(name)
                )
            if not found and data is not None:
                data.problem(
                    display_name(path),
                    None,
                    "no trace files in this directory (journals are *.jsonl, exports *.json, *.gz)",
                )
            files.extend(sorted(found, key=rotation_order))
        else:
            files.append(path)
    return files


def _written_end(descriptor: int, size: int) -> int:
    """`size` less the zero bytes the file ends in, where they are no more than RESERVED_TAIL_BYTES (a
    journal writer's reserved space); `size` where there are more (a sparse file's hole, which the line
    reader moves past)."""
    end = end_before_zeros(descriptor, size, RESERVED_TAIL_BYTES)
    return size if end is None else end


def end_before_zeros(descriptor: int, end: int, limit: int) -> int | None:
    """Where the bytes before `end` stop being zero bytes (a live journal writer's reserved, mapped space),
    looked for over at most `limit` bytes back, in steps; None where all of those are zero."""
    stop = max(0, end - limit)
    while end > stop:
        start = max(stop, end - TAIL_STEP_BYTES)
        written = len(os.pread(descriptor, end - start, start).rstrip(b"\0"))
        if written:
            return start + written
        end = start
    return end if end == 0 else None


def open_input(path: str, limits: ReadLimits) -> tuple[io.BufferedReader[Any], Callable[[], int], bool, int]:
    """A buffered byte stream of the file's content as it stood when opened (decompressed, within
    `limits`), a callable giving bytes read on disk, whether the file is compressed, and its size then."""
    on_disk = AsOpened(path)
    raw = io.BufferedReader(on_disk, buffer_size=BUFFER_BYTES)
    if on_disk.compressed:
        limit = min(limits.input_bytes, limits.expanded_bytes(on_disk.size))
        reason = (
            f"decompressed, it is larger than {limit:,} bytes (the bound: {EXPANSION_RATIO} times the compressed size, "
            f"at least {EXPANDED_BYTES_FLOOR >> 20} MiB; {EXPANDED_BYTES_VARIABLE} or --max expanded-bytes=… sets "
            "another); reading stopped there"
        )
        bounded = Bounded(gzip.GzipFile(fileobj=raw, mode="rb"), limit, reason)  # type: ignore[arg-type]
        return io.BufferedReader(bounded, buffer_size=GZIP_STEP_BYTES), raw.tell, True, on_disk.size
    return raw, raw.tell, False, on_disk.size
