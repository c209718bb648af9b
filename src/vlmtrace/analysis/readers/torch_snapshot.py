"""PyTorch CUDA memory snapshots (`torch.cuda.memory._snapshot()` pickles): the deep view of one moment.

A snapshot is untrusted input: it is decoded by plain_pickle.py, which builds only plain dicts, lists,
strings and numbers, within the input budget's `snapshot_bytes` of memory and its CPU seconds (`pickle`
itself is never run on it). A pickle can reference one object many times, so a small
file can describe billions of blocks and frames: the walk stops after the input budget's
`snapshot_blocks` (budget.py), naming sites stops once its `snapshot_frame_bytes` of frame file names
were looked at, and a field of the wrong type counts as absent. The summary answers what the span readings cannot: how
the reserved bytes split into live tensors, cached free blocks and fragments, and which code owns them.
"""

from __future__ import annotations

import dataclasses
import struct
from collections import defaultdict
from typing import IO, Any

from vlmtrace.analysis.readers import budget
from vlmtrace.analysis.readers.plain_pickle import PickleRefused, load
from vlmtrace.analysis.trace_data import TraceData

PICKLE_MAGIC = b"\x80"
TOP_SITES = 10
INT64_MAX = 2**63 - 1
UNNAMED = "(not named: frame budget spent)"
MAX_FILENAME_CHARS = 4096  # PATH_MAX: a longer "file name" is no file's
SITE_CHARS = 300
# Frames looked at per block to name its allocation site; the application's frame is among the first.
SITE_FRAMES = 64
_FRAMEWORK_PREFIXES = ("torch::", "c10::", "at::", "std::", "execute_native_thread_routine", "clone", "pthread")


@dataclasses.dataclass
class SnapshotSummary:
    source: str
    devices: list[dict]
    top_sites: list[dict]
    allocator_settings: dict
    trace_entries: int


class _Sites:
    """Names allocation sites from frames; one list of frames is named once (a pickle shares one list
    among many blocks), and the frame file-name bytes looked at are spent from the input's budget."""

    def __init__(self, spending: budget.Budget) -> None:
        self._spending = spending
        self._named: dict[int, str] = {}
        self.unnamed = 0  # blocks left unnamed once the allowance was spent

    def site(self, frames: Any) -> str:
        if not isinstance(frames, list) or not frames:
            return "(no stack recorded)"
        known = self._named.get(id(frames))
        if known is None:
            known = self._named[id(frames)] = self._name(frames)
        if known == UNNAMED:
            self.unnamed += 1
        return known

    def _name(self, frames: list) -> str:
        frames = [frame for frame in frames[:SITE_FRAMES] if isinstance(frame, dict)]
        if not frames:
            return "(unreadable frame)"
        for frame in frames:
            filename = frame.get("filename")
            if not isinstance(filename, str):
                continue
            if not self._spending.spend_frame_bytes(len(filename)):
                return UNNAMED
            if len(filename) <= MAX_FILENAME_CHARS and filename.endswith(".py"):
                filename = filename.replace("\\", "/")
                if "/torch/" not in filename:
                    return _shown(
                        f"{_text(frame.get('name'))} ({filename.rsplit('/', 1)[-1]}:{_text(frame.get('line'))})"
                    )
        for frame in frames:
            name = frame.get("name")
            if isinstance(name, str) and not name.startswith(_FRAMEWORK_PREFIXES):
                return _shown(name)
        return _shown(_text(frames[0].get("name")))


def _text(value: Any) -> str:
    """A frame's name or line as text, whatever its type (an int past Python's digit limit included)."""
    if isinstance(value, str):
        return value[:SITE_CHARS]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63:
        return str(value)
    return "?" if value is None or not isinstance(value, (float, bool)) else str(value)


def _shown(site: str) -> str:
    return site if len(site) <= SITE_CHARS else site[: SITE_CHARS - 1] + "…"


class _Fields:
    """Reads snapshot fields; one present with the wrong type counts as absent, and is counted."""

    def __init__(self) -> None:
        self.wrong = 0

    def size(self, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX:
            return value
        self.wrong += value is not None
        return 0

    def sequence(self, value: Any) -> list[Any]:
        if isinstance(value, list):
            return value
        self.wrong += value is not None
        return []

    def dicts(self, values: list) -> list[dict]:
        kept = [value for value in values if isinstance(value, dict)]
        self.wrong += len(values) - len(kept)
        return kept


def summarise(snapshot: dict, source: str, spending: budget.Budget) -> tuple[SnapshotSummary, bool, int, int]:
    """The snapshot's summary, whether the walk stopped at the budget's `snapshot_blocks` blocks, how
    many fields had the wrong type, and how many blocks' sites were left unnamed (frame bytes spent)."""
    fields = _Fields()
    sites_named = _Sites(spending)
    max_blocks = spending.limits.snapshot_blocks
    devices: dict[int, dict] = {}
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    blocks_left = max_blocks
    for segment in fields.sequence(snapshot.get("segments")):
        if not isinstance(segment, dict):
            fields.wrong += 1
            continue
        if blocks_left <= 0:
            break
        device = segment.get("device", 0)
        if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < 2**31:
            fields.wrong += 1
            device = _text(device)[:40]
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
        blocks = fields.dicts(fields.sequence(segment.get("blocks"))[:blocks_left])
        blocks_left -= max(1, len(blocks))
        entry["segments"] += 1
        entry["reserved_bytes"] += fields.size(segment.get("total_size"))
        entry["expandable_segments"] += segment.get("is_expandable") is True
        for block in blocks:
            spending.tick()
            size = fields.size(block.get("size"))
            if block.get("state") == "active_allocated":
                entry["allocated_bytes"] += size
                site = sites[sites_named.site(block.get("frames") or segment.get("frames"))]
                site[0] += size
                site[1] += 1
            elif block.get("state") == "inactive":
                entry["cached_free_bytes"] += size
                entry["largest_free_block"] = max(entry["largest_free_block"], size)
                if len(blocks) > 1:
                    entry["inactive_split_bytes"] += size
    given = snapshot.get("allocator_settings")
    settings: dict[Any, Any] = given if isinstance(given, dict) else {}
    traces = fields.sequence(snapshot.get("device_traces"))
    top = sorted(sites.items(), key=lambda item: -item[1][0])[:TOP_SITES]
    summary = SnapshotSummary(
        source=source,
        devices=[devices[key] for key in sorted(devices, key=str)],
        top_sites=[{"site": site, "bytes": size, "blocks": count} for site, (size, count) in top],
        allocator_settings={
            key: _setting(settings[key])
            for key in (
                "PYTORCH_CUDA_ALLOC_CONF",
                "expandable_segments",
                "max_split_size",
                "garbage_collection_threshold",
            )
            if key in settings
        },
        trace_entries=sum(len(trace) for trace in traces if isinstance(trace, list)),
    )
    return summary, blocks_left <= 0, fields.wrong, sites_named.unnamed


def _setting(value: Any) -> Any:
    """An allocator setting as the summary can hold it: a number, a flag or short text."""
    if isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) <= INT64_MAX):
        return value
    return _text(value) if isinstance(value, str) else "(not a plain value)"


def add_snapshot(data: TraceData, stream: IO[bytes], source: str) -> None:
    spending = budget.current()
    max_blocks = spending.limits.snapshot_blocks
    limit = spending.limits.snapshot_bytes
    try:
        snapshot = load(stream, limit, spending.check)
    except PickleRefused as error:
        more = " (--max snapshot-bytes=… raises it)" if str(error).startswith("it needs more than") else ""
        data.problem(source, None, f"not a readable PyTorch memory snapshot: {str(error)[:300]}{more}")
        return
    except (EOFError, ValueError, struct.error) as error:
        data.problem(
            source, None, f"not a readable PyTorch memory snapshot: {str(error)[:200] or type(error).__name__}"
        )
        return
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        data.problem(source, None, "a pickle, but not a PyTorch memory snapshot (no 'segments')")
        return
    summary, stopped, wrong, unnamed = summarise(snapshot, source, spending)
    if unnamed:
        limit = spending.limits.snapshot_frame_bytes
        data.problem(
            source,
            None,
            f"{unnamed:,} allocated blocks' sites not named: their frames' file names passed the bound of "
            f"{limit:,} bytes looked at (--max snapshot-frame-bytes=… raises it)",
        )
    if wrong:
        data.problem(
            source, None, f"{wrong:,} snapshot field{'s' if wrong != 1 else ''} of the wrong type, read as absent"
        )
    if stopped:
        data.problem(
            source,
            None,
            f"more than {max_blocks:,} memory blocks (shared references?); the first {max_blocks:,} were summarised",
        )
    data.snapshots.append(summary)
