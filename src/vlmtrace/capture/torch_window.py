"""Torch tensors and cache: `torch.cuda.memory._record_memory_history` with Python stacks, on for the
window, then `_snapshot()` and off. The snapshot is written beside the journal (a pickle that PyTorch's
memory_viz reads: https://pytorch.org/memory_viz); the blocks still allocated that carry a stack were
allocated during the window and kept, and are grouped by site here, where torch is.

Only where this process has initialised CUDA through torch (the PyTorch engine, or the application's
own torch work): vlmtrace never initialises CUDA itself, and never turns off a history the application
turned on.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

from vlmtrace.capture.sites import Frame, Site, StageMap, group

MAX_ENTRIES = 100_000  # allocation and free events the history keeps (its ring): bounds the snapshot file
TOOL = "torch.cuda.memory._record_memory_history"


def _cuda() -> Any:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return cuda if cuda is not None and cuda.is_available() and cuda.is_initialized() else None


class TorchWindow:
    tool = TOOL

    @staticmethod
    def available() -> str | None:
        if _cuda() is None:
            return "torch has not initialised CUDA in this process"
        is_enabled = getattr(sys.modules["torch"]._C, "_cuda_isHistoryEnabled", None)
        if is_enabled is not None and is_enabled():
            return "torch's memory history is already on (started by the application)"
        return None

    def open(self) -> None:
        record = _cuda().memory._record_memory_history
        try:  # a later window must not see the stacks of an earlier one's blocks
            record(max_entries=MAX_ENTRIES, context="alloc", stacks="python", clear_history=True)
        except TypeError:  # torch before `clear_history`
            record(max_entries=MAX_ENTRIES, context="alloc", stacks="python")

    def traced_bytes(self) -> int:
        return 0  # the history's own cost is bounded by MAX_ENTRIES

    def close(self, stages: StageMap, snapshot_path: str | None) -> tuple[list[Site], str | None]:
        """The sites of the blocks the window allocated and kept; the history off (also where that failed)."""
        memory = _cuda().memory
        try:
            snapshot = memory._snapshot()
        finally:
            memory._record_memory_history(enabled=None)
        written = None
        if snapshot_path is not None:
            with open(snapshot_path, "wb") as out:
                pickle.dump(snapshot, out)
            written = os.path.basename(snapshot_path)
        return group(_allocations(snapshot), stages), written

    def abandon(self) -> None:
        cuda = _cuda()
        if cuda is not None:
            cuda.memory._record_memory_history(enabled=None)


def _window_addresses(snapshot: dict) -> set[int] | None:
    """The addresses the window's trace saw allocated; None where its ring overflowed (it lost the start)."""
    traces = snapshot.get("device_traces") or []
    if any(len(trace) >= MAX_ENTRIES for trace in traces):
        return None
    return {entry.get("addr") for trace in traces for entry in trace if entry.get("action") == "alloc"}


def _allocations(snapshot: dict) -> Any:
    """The blocks allocated during the window and still allocated: those with a stack (the history
    records one per allocation while on) that the window's trace saw allocated (a block an earlier
    window allocated keeps its stack)."""
    window = _window_addresses(snapshot)
    for segment in snapshot.get("segments", ()):
        for block in segment.get("blocks", ()):
            frames = block.get("frames") or []
            if (
                block.get("state") == "active_allocated"
                and frames
                and (window is None or block.get("address") in window)
            ):
                stack = [
                    Frame(str(frame.get("filename", "?")), int(frame.get("line", 0) or 0), frame.get("name"))
                    for frame in frames
                    if isinstance(frame, dict)
                ]
                yield stack, int(block.get("size", 0)), 1
