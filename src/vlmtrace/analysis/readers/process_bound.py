"""The bound on processes in all inputs together (`--max processes=`), applied before a file is read.

A journal directory holds a file per process, or several (rotated). Past the bound, the files of more
processes are left out unread: a journal file's process is known from its name (`vlmtrace-HOST-PID-START.N.jsonl`,
as the writer names files) or, for a plain file named otherwise, from the header on its first line.
A file whose processes are not known so cheaply (an export, a compressed file named otherwise, a header
longer than HEADER_PEEK_BYTES) is read, and left out after it was read where its processes would pass the
bound. The files left out are one problem: how many, the first of them, and the option that raises the bound.
"""

from __future__ import annotations

import os
import stat

import orjson

from vlmtrace.analysis.readers.files import GZIP_MAGIC, display_name
from vlmtrace.analysis.readers.journal_processes import KNOWN_VERSIONS, WRITER_FILE_NAME, process_label
from vlmtrace.analysis.trace_data import Problem, TraceData

HEADER_PEEK_BYTES = 64 * 1024  # of a file's first line, looked at for its header


def process_of(path: str) -> str | None:
    """The label of the one process whose records a journal file holds first, as the journal reader names
    it, where its name or its first line says; None where only reading it would tell."""
    name = os.path.basename(path)
    named = WRITER_FILE_NAME.match(name)
    if named is not None:
        return f"{named['host']}:{int(named['pid'])}"
    try:
        # Opened without blocking, and read only if it is a regular file: a FIFO would wait for a writer.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        head = os.read(descriptor, HEADER_PEEK_BYTES)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    first, newline, _ = head.partition(b"\n")
    if not newline or head[:2] == GZIP_MAGIC:
        return None
    try:
        header = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None
    if type(header) is not dict or header.get("k") != "header":
        return None
    version = header.get("v")
    if version is not None and not (type(version) is int and version in KNOWN_VERSIONS):
        return None  # its records are skipped: it adds no process
    return process_label(header, os.path.basename(display_name(path)))


class ProcessBound:
    """The processes read so far from all inputs, against `limit`; the files left out for it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left_out: list[str] = []

    def admitted(self, data: TraceData, files: list[str]) -> list[str]:
        """`files` less those whose process is known before reading and is one more than the bound allows
        beside the processes in `data` (the first file is always read: its own budget bounds it)."""
        known = {info.label for info in data.processes}
        kept = []
        for path in files:
            label = process_of(path)
            if label is not None and label not in known:
                if len(known) >= self.limit:
                    self.left_out.append(path)
                    continue
                known.add(label)
            kept.append(path)
        return kept

    def fits(self, data: TraceData, part: TraceData, path: str) -> bool:
        """Whether the processes of `part`, read from `path`, keep `data` within the bound; if not, the
        file is left out."""
        if (
            not data.processes
            or len(data.processes) + len(part.processes) <= self.limit
            or len(data.processes)
            + len({info.label for info in part.processes} - {info.label for info in data.processes})
            <= self.limit
        ):
            return True
        self.left_out.append(path)
        return False

    def report(self, data: TraceData) -> None:
        """The files left out, as one problem (always listed: it names the bound to raise)."""
        if not self.left_out:
            return
        count = len(self.left_out)
        files = "1 file" if count == 1 else f"{count:,} files"
        data.problems.append(
            Problem(
                display_name(self.left_out[0]),
                None,
                f"{files} not read (this one first): their processes would pass the bound of {self.limit:,} "
                "processes in all inputs (--max processes=… raises it)",
            )
        )
