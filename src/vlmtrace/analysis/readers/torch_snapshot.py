"""PyTorch CUDA memory snapshots (`torch.cuda.memory._snapshot()` pickles): the deep view of one moment.

A snapshot is untrusted input: it is unpickled with a loader that refuses every class, so only plain
dicts, lists, strings and numbers come out. A pickle can reference one object many times, so a small
file can describe billions of blocks: the walk stops after `MAX_SNAPSHOT_BLOCKS`, and a field of the
wrong type counts as absent. The summary answers what the span readings cannot: how
the reserved bytes split into live tensors, cached free blocks and fragments, and which code owns them.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections import defaultdict
from typing import IO, Any

from vlmtrace.analysis.trace_data import TraceData

PICKLE_MAGIC = b"\x80"
TOP_SITES = 10
MAX_SNAPSHOT_BLOCKS = 2_000_000
# Frames looked at per block to name its allocation site; the application's frame is among the first.
SITE_FRAMES = 64
_FRAMEWORK_PREFIXES = ("torch::", "c10::", "at::", "std::", "execute_native_thread_routine", "clone", "pthread")


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: snapshots hold plain data only")


@dataclasses.dataclass
class SnapshotSummary:
    source: str
    devices: list[dict]
    top_sites: list[dict]
    allocator_settings: dict
    trace_entries: int


def _site(frames: Any) -> str:
    """The first frame that is the application's code rather than the allocator's own."""
    if not isinstance(frames, list) or not frames:
        return "(no stack recorded)"
    frames = frames[:SITE_FRAMES]
    for frame in frames:
        if isinstance(frame, dict) and str(frame.get("filename", "")).endswith(".py"):
            filename = str(frame["filename"]).replace("\\", "/")
            if "/torch/" not in filename:
                return f"{frame.get('name')} ({filename.rsplit('/', 1)[-1]}:{frame.get('line')})"
    for frame in frames:
        if isinstance(frame, dict) and not str(frame.get("name", "")).startswith(_FRAMEWORK_PREFIXES):
            return str(frame.get("name"))
    return str(frames[0].get("name")) if isinstance(frames[0], dict) else "(unreadable frame)"


class _Fields:
    """Reads snapshot fields; one present with the wrong type counts as absent, and is counted."""

    def __init__(self) -> None:
        self.wrong = 0

    def size(self, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        self.wrong += value is not None
        return 0

    def list(self, value: Any) -> list:
        if isinstance(value, list):
            return value
        self.wrong += value is not None
        return []

    def dicts(self, values: list) -> list[dict]:
        kept = [value for value in values if isinstance(value, dict)]
        self.wrong += len(values) - len(kept)
        return kept


def summarise(snapshot: dict, source: str, max_blocks: int = MAX_SNAPSHOT_BLOCKS) -> tuple[SnapshotSummary, bool, int]:
    """The snapshot's summary, whether the walk stopped at `max_blocks` blocks, and how many fields
    had the wrong type."""
    fields = _Fields()
    devices: dict[int, dict] = {}
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    blocks_left = max_blocks
    for segment in fields.list(snapshot.get("segments")):
        if not isinstance(segment, dict):
            fields.wrong += 1
            continue
        if blocks_left <= 0:
            break
        device = segment.get("device", 0)
        if not isinstance(device, int):
            fields.wrong += 1
            device = str(device)[:40]
        entry = devices.setdefault(
            device,
            {
                "device": device,
                "segments": 0,
                "reserved_bytes": 0,
                "allocated_bytes": 0,
                "cached_free_bytes": 0,
                "inactive_split_bytes": 0,
                "largest_free_block": 0,
                "expandable_segments": 0,
            },
        )
        blocks = fields.dicts(fields.list(segment.get("blocks"))[:blocks_left])
        blocks_left -= max(1, len(blocks))
        entry["segments"] += 1
        entry["reserved_bytes"] += fields.size(segment.get("total_size"))
        entry["expandable_segments"] += segment.get("is_expandable") is True
        for block in blocks:
            size = fields.size(block.get("size"))
            if block.get("state") == "active_allocated":
                entry["allocated_bytes"] += size
                site = sites[_site(block.get("frames") or segment.get("frames"))]
                site[0] += size
                site[1] += 1
            elif block.get("state") == "inactive":
                entry["cached_free_bytes"] += size
                entry["largest_free_block"] = max(entry["largest_free_block"], size)
                if len(blocks) > 1:
                    entry["inactive_split_bytes"] += size
    settings = snapshot.get("allocator_settings") if isinstance(snapshot.get("allocator_settings"), dict) else {}
    traces = fields.list(snapshot.get("device_traces"))
    top = sorted(sites.items(), key=lambda item: -item[1][0])[:TOP_SITES]
    summary = SnapshotSummary(
        source=source,
        devices=[devices[key] for key in sorted(devices, key=str)],
        top_sites=[{"site": site, "bytes": size, "blocks": count} for site, (size, count) in top],
        allocator_settings={
            key: settings[key]
            for key in ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "max_split_size", "garbage_collection_threshold")
            if key in settings
        },
        trace_entries=sum(len(trace) for trace in traces if isinstance(trace, list)),
    )
    return summary, blocks_left <= 0, fields.wrong


def add_snapshot(data: TraceData, stream: IO[bytes], source: str, max_blocks: int = MAX_SNAPSHOT_BLOCKS) -> None:
    try:
        snapshot = _PlainDataUnpickler(stream).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, RecursionError) as error:
        data.problem(source, None, f"not a readable PyTorch memory snapshot: {error}")
        return
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        data.problem(source, None, "a pickle, but not a PyTorch memory snapshot (no 'segments')")
        return
    summary, stopped, wrong = summarise(snapshot, source, max_blocks)
    if wrong:
        data.problem(source, None, f"{wrong:,} snapshot field{'s' if wrong != 1 else ''} of the wrong type, read as absent")
    if stopped:
        data.problem(source, None, f"more than {max_blocks:,} memory blocks (shared references?); the first {max_blocks:,} were summarised")
    data.snapshots.append(summary)
