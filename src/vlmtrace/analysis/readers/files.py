"""Which files are read, and how much of each: directories walked for trace files, special files
refused with what they are, and compressed input read only up to a bound (`ReadLimits`), so a small
gzip bomb costs seconds, not the machine's memory.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import io
import os
import re
import stat
from collections.abc import Callable, Iterable
from typing import IO

from vlmtrace.analysis.readers.journal import rotation_order
from vlmtrace.analysis.readers.torch_snapshot import MAX_SNAPSHOT_BLOCKS
from vlmtrace.analysis.trace_data import TraceData

GZIP_MAGIC = b"\x1f\x8b"
BUFFER_BYTES = 1 << 20
# Decompressed in small steps, so a cut-off gzip file loses only its last step.
GZIP_STEP_BYTES = 64 * 1024
# Real journals compress 20-30 to 1; a bound well above that, with a floor for small files.
EXPANSION_RATIO = 64
EXPANDED_BYTES_FLOOR = 128 * 1024 * 1024
EXPANDED_BYTES_VARIABLE = "VLMTRACE_REPORT_MAX_EXPANDED_BYTES"
TRACE_NAME = re.compile(r"\.(jsonl?|pickle|pkl)(\.\d+)?(\.gz)?$|\.gz$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """How much one input may cost. A compressed file is read up to `expansion_ratio` times its size,
    at least `expanded_bytes_floor` (or exactly `expanded_bytes_fixed`, from EXPANDED_BYTES_VARIABLE);
    a snapshot's blocks are summarised up to `snapshot_blocks`."""

    expanded_bytes_floor: int = EXPANDED_BYTES_FLOOR
    expansion_ratio: int = EXPANSION_RATIO
    expanded_bytes_fixed: int | None = None
    snapshot_blocks: int = MAX_SNAPSHOT_BLOCKS

    @classmethod
    def from_environment(cls) -> ReadLimits:
        value = os.environ.get(EXPANDED_BYTES_VARIABLE, "")
        return cls(expanded_bytes_fixed=int(value)) if value.isdigit() else cls()

    def expanded_bytes(self, compressed_size: int) -> int:
        if self.expanded_bytes_fixed is not None:
            return self.expanded_bytes_fixed
        return max(self.expanded_bytes_floor, self.expansion_ratio * compressed_size)


class InputTooLarge(OSError):
    """A compressed input expands beyond its bound; what came before was read."""


class _Bounded(io.RawIOBase):
    """A decompressed stream that raises `InputTooLarge` instead of yielding more than `limit` bytes."""

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        self._inner, self._left, self._limit = inner, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        count = self._inner.readinto(buffer)  # type: ignore[attr-defined]
        self._left -= count
        if self._left < 0:
            raise InputTooLarge(
                f"decompressed, it is larger than {self._limit:,} bytes (the bound: {EXPANSION_RATIO} times the "
                f"compressed size, at least {EXPANDED_BYTES_FLOOR >> 20} MiB; {EXPANDED_BYTES_VARIABLE} sets another); "
                "reading stopped there"
            )
        return count

    def close(self) -> None:
        self._inner.close()
        super().close()


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
            found = []

            def unlisted(error: OSError, top: str = path) -> None:
                if data is not None:
                    name = display_name(error.filename or top)
                    data.problem(name, None, f"directory cannot be listed ({error.strerror or error}); its files were not read")

            for root, dirs, names in os.walk(path, onerror=unlisted):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(os.path.join(root, name) for name in names if not name.startswith(".") and TRACE_NAME.search(name))
            if not found and data is not None:
                data.problem(display_name(path), None, "no trace files in this directory (journals are *.jsonl, exports *.json, *.gz)")
            files.extend(sorted(found, key=rotation_order))
        else:
            files.append(path)
    return files


def open_input(path: str, limits: ReadLimits) -> tuple[IO[bytes], Callable[[], int], bool]:
    """A buffered byte stream of the file's content (decompressed, within `limits`), a callable
    giving bytes read on disk, and whether the file is compressed."""
    raw = open(path, "rb", buffering=BUFFER_BYTES)
    if raw.peek(2)[:2] == GZIP_MAGIC:
        bounded = _Bounded(gzip.GzipFile(fileobj=raw, mode="rb"), limits.expanded_bytes(os.fstat(raw.fileno()).st_size))  # type: ignore[arg-type]
        return io.BufferedReader(bounded, buffer_size=GZIP_STEP_BYTES), raw.tell, True
    return raw, raw.tell, False
