"""Read one large journal file on every core: line-aligned byte ranges, one process each, merged in order.

Parsing JSON is most of the analyzer's time on big inputs and CPython parses on one core. Workers
are forked (Linux; elsewhere the file is read in one process), so nothing is re-imported and a
user's script needs no `__main__` guard; callers keep no threads of their own running meanwhile. A range
after the first starts in the middle of some process's records, so its worker files them under a
placeholder process that the merge resolves to whichever process was current where the previous
range ended. Line numbers are shifted by the lines of the ranges before; a span started in one range
and ended in a later one is no longer in flight.
"""

from __future__ import annotations

import concurrent.futures
import io
import multiprocessing
import os
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from vlmtrace.analysis.readers.journal import THREAD, JournalReader
from vlmtrace.analysis.trace_data import TraceData

CONTINUATION = "\0continuation"
MIN_RANGE_BYTES = 32 * 1024 * 1024
BUFFER_BYTES = 1 << 20
POLL_S = 0.2

_positions = None


class _Window(io.RawIOBase):
    """The bytes [start, end) of a file, as a raw stream."""

    def __init__(self, path: str, start: int, end: int) -> None:
        self._file = open(path, "rb", buffering=0)
        self._file.seek(start)
        self._end = end
        self._left = end - start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[: min(len(buffer), self._left)]
        count = self._file.readinto(view) or 0
        self._left -= count
        return count

    def position(self) -> int:
        return self._end - self._left

    def close(self) -> None:
        self._file.close()
        super().close()


def ranges(path: str, parts: int) -> list[tuple[int, int]]:
    """`parts` byte ranges of the file, each starting at the beginning of a line."""
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as handle:
        for part in range(1, parts):
            handle.seek(max(bounds[-1], size * part // parts))
            handle.readline()
            if handle.tell() < size:
                bounds.append(handle.tell())
    bounds.append(size)
    return [(start, end) for start, end in zip(bounds, bounds[1:]) if end > start]


def _init_worker(positions) -> None:  # type: ignore[no-untyped-def]
    global _positions
    _positions = positions


def _read_range(path: str, slot: int, start: int, end: int, last: bool) -> tuple[TraceData, dict, int, str | None]:
    """Worker: read one range into a fresh TraceData; returns it, its pending starts, its line count
    and the label of the process current at its end."""
    data = TraceData()
    reader = JournalReader(data)
    process = data.process(CONTINUATION, from_journal=True) if start > 0 else None
    window = _Window(path, start, end)

    def progress(position: int) -> None:
        if _positions is not None:
            _positions[slot] = position - start

    with io.BufferedReader(window, BUFFER_BYTES) as stream:
        lines = reader.read_file(path, stream, window.position, progress, process=process, ends_file=last)
    progress(end)
    current = reader.current_process
    return data, reader.pending, lines, data.processes[current].label if current is not None else None


def _merge(
    data: TraceData, reader: JournalReader, part: TraceData, pending: dict, line_offset: int, continuing: int | None, path: str
) -> dict[int, int]:
    """Fold one worker's result into `data`; returns its process numbering in `data`."""
    process_map: dict[int, int] = {}
    for index, info in enumerate(part.processes):
        if info.label == CONTINUATION:
            target = continuing if continuing is not None else data.process(os.path.basename(path), from_journal=True)
        else:
            target = data.process(
                info.label, host=info.host, pid=info.pid, service=info.service, resource=info.resource,
                versions=info.versions, argv=info.argv, from_journal=True,
            )
        mine = data.processes[target]
        mine.clean_end = mine.clean_end or info.clean_end
        mine.end_unread = mine.end_unread or info.end_unread
        if info.last_record_ns is not None:
            mine.last_record_ns = max(mine.last_record_ns or info.last_record_ns, info.last_record_ns)
        mine.sources.extend(source for source in info.sources if source not in mine.sources)
        process_map[index] = target
    ended = part.spans.span_ids()
    threads: dict[str, str] = {}
    for waiting in reader.pending.values():
        if waiting and len(ended):
            ids = list(waiting)
            found = pc.is_in(pa.array(ids, pa.string()), value_set=ended.combine_chunks()).to_pylist()
            for span_id, hit in zip(ids, found):
                if hit:
                    thread = THREAD.search(waiting.pop(span_id))
                    if thread:
                        threads[span_id] = thread.group(1).decode("utf-8", "replace")
    if threads:
        part.spans.fill_threads(threads)
    data.spans.absorb(part.spans, process_map)
    data.samples.absorb(part.samples, process_map)
    data.devices.absorb(part.devices, process_map)
    for problem in part.problems:
        if problem.line is not None:
            problem.line += line_offset
        data.problems.append(problem)
    for block in part.fatal:
        block.line += line_offset
        block.process = process_map[block.process]
        data.fatal.append(block)
    data.warnings.extend(part.warnings)
    for key, value in part.dropped.items():
        data.dropped[key] = max(data.dropped.get(key, 0), value)
    for process, entries in pending.items():
        target = reader.pending.setdefault(process_map[process], {})
        target.update(entries)
    return process_map


def read_parallel(
    data: TraceData, reader: JournalReader, path: str, workers: int, progress: Callable[[int], None] | None
) -> None:
    """Read a plain (uncompressed) journal file with `workers` processes into `data`."""
    parts = ranges(path, workers)
    context = multiprocessing.get_context("fork")
    positions = context.Array("q", len(parts), lock=False)
    with concurrent.futures.ProcessPoolExecutor(len(parts), mp_context=context, initializer=_init_worker, initargs=(positions,)) as pool:
        futures = [
            pool.submit(_read_range, path, slot, start, end, slot == len(parts) - 1) for slot, (start, end) in enumerate(parts)
        ]
        while not all(future.done() for future in futures):
            if progress is not None:
                progress(sum(positions))
            time.sleep(POLL_S)
        results = [future.result() for future in futures]
    line_offset = 0
    continuing: int | None = reader.current_process
    for part, pending, lines, current_label in results:
        process_map = _merge(data, reader, part, pending, line_offset, continuing, path)
        line_offset += lines
        if current_label is not None:
            continuing = process_map[next(i for i, info in enumerate(part.processes) if info.label == current_label)]
    reader.current_process = continuing


def worker_count(size: int) -> int:
    """How many processes should read a file of `size` bytes: one per core, each with a large range."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(os.cpu_count() or 1, size // MIN_RANGE_BYTES))
