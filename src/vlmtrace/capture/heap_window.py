"""The host Python heap's window: `tracemalloc` started with FRAMES frames per allocation, a snapshot at
the start and one at the end compared, then stopped. What the second holds beyond the first is what the
window allocated and kept, by stack.

tracemalloc sees the allocations of Python's allocators only: memory a C extension or a native library
takes with malloc (and resident pages of mapped files) has no site here. A window that tracemalloc was
already running before (the application's own tracing) is not opened: vlmtrace never stops what it did
not start.
"""

from __future__ import annotations

import tracemalloc

from vlmtrace.capture.sites import Frame, Site, StageMap, group

FRAMES = 8  # a stage function up to a few calls out from the site; each frame more costs (docs/capture.md)
TOOL = "tracemalloc"


class HeapWindow:
    tool = TOOL

    def __init__(self) -> None:
        self._first: tracemalloc.Snapshot | None = None

    @staticmethod
    def available() -> str | None:
        """None where a window can open; else why not."""
        if tracemalloc.is_tracing():
            return "tracemalloc is already running (started by the application)"
        return None

    def open(self) -> None:
        tracemalloc.start(FRAMES)
        self._first = tracemalloc.take_snapshot()

    def traced_bytes(self) -> int:
        return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0

    def close(self, stages: StageMap, snapshot_path: str | None) -> tuple[list[Site], str | None]:
        """The sites of what the window kept; tracemalloc stopped (also where reading them failed)."""
        try:
            last = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        first, self._first = self._first, None
        differences = last.compare_to(first, "traceback") if first is not None else []
        allocations = (
            (
                [Frame(frame.filename, frame.lineno) for frame in reversed(difference.traceback)],
                difference.size_diff,
                difference.count_diff,
            )
            for difference in differences
            if difference.size_diff > 0
        )
        return group(allocations, stages), None

    def abandon(self) -> None:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        self._first = None
