"""Read many input files on every core: one file per forked process, merged in file order.

A service's journal is a directory of files (the writer rotates at 32 MiB), so a file is the unit of
work: no file is split, and each worker reads its file exactly as the one-process reader would.
Workers are forked (Linux; elsewhere the files are read one after the other, line by line), so
nothing is re-imported and a user's script needs no `__main__` guard; callers keep no threads of their
own running meanwhile. Even a single file is read in a worker: DuckDB (journal_columns.py) runs only
there, never in the process that forks (a process forked after DuckDB ran in its parent can hang). What ties one file to the next is the journal's spans that start in one rotated
file and end in a later one: the merge hands their start records over, as one reader would.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from vlmtrace.analysis.readers.files import display_name
from vlmtrace.analysis.readers.journal import JournalReader, thread_of
from vlmtrace.analysis.readers.process_bound import ProcessBound
from vlmtrace.analysis.trace_data import TraceData

if TYPE_CHECKING:
    import ctypes

POLL_S = 0.2

# (data, reader, path, progress, columnar): `columnar` is True in a worker, where DuckDB may run.
ReadFile = Callable[[TraceData, JournalReader, str, Callable[[int], None] | None, bool], None]

# Set in each worker when it starts (inherited through the fork, never pickled: a closure would not be).
_positions: ctypes.Array[ctypes.c_longlong] | None = None  # bytes read of each file, shared with the parent
_read_file: ReadFile | None = None


# At most this many reading processes (a positive integer, capped at the cores); unset: one per core. Each holds up to ~0.6 GiB
# while it reads a 32 MiB file, beside the main process: 1 keeps the whole report near 1 GiB at a million
# spans, at the cost of reading on one core (docs/performance.md).
PROCESSES_VARIABLE = "VLMTRACE_REPORT_PROCESSES"


def worker_count(files: int) -> int:
    """How many processes should read `files` files: one per core (or VLMTRACE_REPORT_PROCESSES, never
    more than the cores), at most one per file; 0 where processes cannot be forked (the files are read
    in this one, line by line)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 0
    cores = os.cpu_count() or 1
    try:
        wanted = processes_wanted() or cores
    except ValueError:  # the commands refuse it first (exit 2); called as a library, one per core
        wanted = cores
    return max(1, min(wanted, cores, files))


def processes_wanted() -> int | None:
    """PROCESSES_VARIABLE as a count (None where unset); ValueError naming it where it is not one."""
    setting = os.environ.get(PROCESSES_VARIABLE, "").strip()
    if not setting:
        return None
    if not (setting.isascii() and setting.isdigit() and len(setting) <= 6 and int(setting) > 0):
        raise ValueError(f"{PROCESSES_VARIABLE}={setting[:40]!r} is not a count of processes (1 to 999999)")
    return int(setting)


def _init_worker(positions: ctypes.Array[ctypes.c_longlong], read_file: ReadFile) -> None:
    global _positions, _read_file
    _positions, _read_file = positions, read_file


def read_one(
    path: str, read_file: ReadFile, progress: Callable[[int], None], columnar: bool
) -> tuple[TraceData, dict[int, dict[str, bytes]]]:
    """Read one file into a fresh TraceData; returns it and the start records still waiting for their end.
    A file whose content makes the reader fail (a value of a type no check foresaw, memory exhausted)
    is named and skipped, whole: what it had added is dropped, and the other files are reported."""
    data = TraceData()
    reader = JournalReader(data)
    try:
        read_file(data, reader, path, progress, columnar)
    except Exception as error:  # noqa: BLE001 - one bad file never sinks the others
        data = TraceData()
        reader = JournalReader(data)
        what = f"{type(error).__name__}: {error}".splitlines()[0][:200] if str(error) else type(error).__name__
        data.problem(
            display_name(path),
            None,
            f"could not be read ({what}); the file was skipped. If it is a "
            "well-formed trace file, this is a vlmtrace bug: please report it",
        )
    return data, reader.pending


def _read_one(path: str, slot: int) -> tuple[TraceData, dict[int, dict[str, bytes]]]:
    """Worker: one file, its position reported through the shared array."""

    def progress(position: int) -> None:
        if _positions is not None:
            _positions[slot] = position

    assert _read_file is not None
    return read_one(path, _read_file, progress, True)


def _hand_over_starts(reader: JournalReader, part: TraceData, process_map: dict[int, int]) -> None:
    """Spans of `part` whose start records wait in `reader` (started in an earlier file): their thread,
    as one reader would have taken it from the start record, and the start no longer waits."""
    waiting = [span_id for starts in reader.pending.values() for span_id in starts]
    rows, span_ids, processes = part.spans.rows_with_ids(pa.array(waiting, pa.string()))
    threads: dict[int, str] = {}
    for row, span_id, process in zip(rows.tolist(), span_ids, processes.tolist(), strict=True):
        thread = thread_of(reader.pending.get(process_map[process], {}).pop(span_id, None))
        if thread is not None:
            threads[row] = thread
    if threads:
        part.spans.set_threads(threads)


def merge(
    data: TraceData,
    reader: JournalReader,
    part: TraceData,
    pending: dict[int, dict[str, bytes]],
    path: str,
    bound: ProcessBound,
) -> None:
    """A file's part merged into `data` as if `reader` had read it after the files before; left out
    (counted by `bound`) when its new processes would take `data` past the bound on processes."""
    if not bound.fits(data, part, path):
        return
    process_map = data.merge_processes(part)
    _hand_over_starts(reader, part, process_map)
    data.absorb(part, process_map)
    for process, starts in pending.items():
        waiting = reader.pending.setdefault(process_map[process], {})
        for span_id, line in starts.items():
            reader.wait_for_end(waiting, span_id, line)
    reader.note_let_go(display_name(path))


def read_files(
    data: TraceData,
    reader: JournalReader,
    paths: list[str],
    sizes: list[int],
    read_file: ReadFile,
    progress: Callable[[int, int], None] | None,
    bound: ProcessBound,
) -> None:
    """Read `paths` with `read_file`, a file per forked process, into `data` in the order given.
    `progress(bytes_done, bytes_total)` is called as it goes."""
    context = multiprocessing.get_context("fork")
    positions = context.Array("q", len(paths), lock=False)
    total = sum(sizes)
    workers = worker_count(len(paths))
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(positions, read_file)
    ) as pool:
        futures = [pool.submit(_read_one, path, slot) for slot, path in enumerate(paths)]
        for slot, future in enumerate(futures):
            while not future.done():
                if progress is not None:
                    progress(sum(positions), total)
                concurrent.futures.wait([future], timeout=POLL_S)
            part, pending = future.result()
            futures[slot] = None  # type: ignore[call-overload]  # the part is merged: let it go
            merge(data, reader, part, pending, paths[slot], bound)
            positions[slot] = sizes[slot]
            if progress is not None:
                progress(sum(positions), total)
