"""Records of no kind a reader knows ("strays"): counted cheaply, and a file of little else not read on.

A good journal may hold a stray record (a line someone added, a newer writer's kind): it is skipped, and
the first STRAYS_LISTED of a file are named with their line, the rest counted in one note. A file whose
records are nearly all strays (at least STRAYS_TO_STOP of them, and 99 in 100 of its lines read) is no
journal or trace file, or not one this vlmtrace reads: reading it stops there, with one problem naming
it, what came before kept. Millions of `{}` lines cost the first ten thousand.
"""

from __future__ import annotations

from vlmtrace.analysis.readers.budget import InputTooLarge
from vlmtrace.analysis.trace_data import TraceData

STRAYS_LISTED = 20
STRAYS_TO_STOP = 10_000
STRAYS_PER_100_LINES = 99


class StraysOnly(InputTooLarge):
    """A file whose lines are nearly all records of no kind its reader knows."""


class Strays:
    """The stray records of one file; `what` names them in the notes ("records of no journal kind")."""

    def __init__(self, data: TraceData, source: str, what: str) -> None:
        self.data, self.source, self.what = data, source, what
        self.count = 0

    def add(self, lineno: int) -> bool:
        """A stray at line `lineno`: True while it is one of the first STRAYS_LISTED (the caller names it).
        Raises StraysOnly where the file's lines so far are nearly all strays."""
        self.count += 1
        if self.count >= STRAYS_TO_STOP and self.count * 100 >= lineno * STRAYS_PER_100_LINES:
            raise StraysOnly(
                f"reading stopped at line {lineno:,}: {self.count:,} {self.what}, {STRAYS_PER_100_LINES} "
                "in 100 of the lines read (not a file this vlmtrace reads); what came before was read"
            )
        return self.count <= STRAYS_LISTED

    def finish(self) -> None:
        """The strays not named, as one note."""
        unnamed = self.count - STRAYS_LISTED
        if unnamed > 0:
            self.data.problem(self.source, None, f"{unnamed:,} more {self.what} skipped (not listed)", "note")
