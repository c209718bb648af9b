"""A journal file as the writer leaves it, read by DuckDB's NDJSON reader straight into columns.

Parsing each line with orjson and picking ~30 fields out of it in Python costs ~0.65 s of CPU per
64 MiB file of format 2; DuckDB parses it in C++ into typed columns and this module turns those into the span and
sample blocks in ~0.4 s (docs/performance.md). It is used for a file that holds what a
clean writer writes: one header, first, then records of the known kinds. Anything else (a torn or
corrupt line, a crash's faulthandler text or zero bytes, a blank line, another process's header, a
field DuckDB cannot cast, NaN or infinity, an unknown kind or format version, a span id twice, per-device
readings of several GPUs, an attribute key that is no index its header declares, more than a bound of
`ReadLimits`)
raises `NotColumnar` before anything is added, and the file is read by the line reader (journal.py),
which names every problem with its line.
The result is the one the line reader gives (tests/analysis/test_journal.py compares them).
"""

from __future__ import annotations

import os
from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers import budget, compact_columns, compact_records, typed
from vlmtrace.analysis.readers.budget import ReadLimits
from vlmtrace.analysis.readers.journal import WARNINGS_KEPT, JournalReader, ended_by, thread_of
from vlmtrace.analysis.readers.journal_processes import KNOWN_VERSIONS
from vlmtrace.analysis.step1_loading.column_keys import (
    FEATURE_KEYS,
    FEATURE_STAGES,
    MISSING_TIME,
    SAMPLE_JSON_KEYS,
    SAMPLE_NUMERIC_KEYS,
    SPAN_MEMORY_KEYS,
)

NOTE_KINDS = ("header", "end_marker", "dropped", "warning", "disk_full", "capture")
KINDS = ("end", "start", "sample", *NOTE_KINDS)
TIMED_KINDS = ("end", "start", "sample", "end_marker")  # those whose `t` is the process's last record time
NUMBER_KEYS = tuple(dict.fromkeys((*SPAN_MEMORY_KEYS, *FEATURE_KEYS, *SAMPLE_NUMERIC_KEYS)))
MEM_KEYS = tuple(dict.fromkeys(key.removesuffix(sc.DELTA_SUFFIX) for key in SPAN_MEMORY_KEYS))
# A reading's fields as DuckDB reads them: the read time an integer, as the line reader keeps it. As a double
# (~1.8e18 ns) it is 256 ns coarse, and a span's read-time delta, end minus start, comes out up to ~200 ns
# off: enough to move a reading across the microsecond by which the analyzer knows a reading used twice.
MEM_TYPES = {**dict.fromkeys(MEM_KEYS, "DOUBLE"), sc.MEM_READ_TIME: "BIGINT"}


class NotColumnar(Exception):
    """The file holds something only the line reader reads as it should."""


def _struct(fields: dict[str, str]) -> str:
    return "STRUCT(" + ", ".join(f'"{name}" {kind}' for name, kind in fields.items()) + ")"


ATTR_FIELDS = {
    **dict.fromkeys(NUMBER_KEYS, "DOUBLE"),
    sc.STAGE: "VARCHAR",
    sc.THREAD_NAME: "VARCHAR",
    sc.MEM_DEVICES: "JSON",
    **dict.fromkeys(SAMPLE_JSON_KEYS, "JSON"),
}
COLUMNS = {
    "k": "VARCHAR",
    "t": "BIGINT",
    "start": "BIGINT",
    "trace_id": "VARCHAR",
    "span_id": "VARCHAR",
    "parent_id": "VARCHAR",
    "name": "VARCHAR",
    "status": "VARCHAR",
    "thread": "VARCHAR",
    "attrs": _struct(ATTR_FIELDS),
    "mem": _struct({**MEM_TYPES, sc.MEM_DEVICES: "JSON"}),
    "mem0": _struct(MEM_TYPES),
}
# Lines up to this size; a longer one (a header with a huge argv) is the line reader's.
MAX_LINE_BYTES = 16 * 1024 * 1024
# DuckDB holds a whole file's columns at once, ~5 times the file's size at its peak (a 64 MiB file:
# ~300 MiB in the worker); a larger file (one old writer's, never rotated) is the line reader's, whose
# memory grows with the spans kept, not with the file.
MAX_FILE_BYTES = 2 * 64 * 1024 * 1024
LINE_SCAN_BYTES = 1 << 20  # read at a time while counting a file's lines
# DuckDB's columns cost 1.5-2 KB per line whatever the line holds (a writer's 32 MiB file of format 3 has ~120,000
# lines of ~280 bytes); a file of more lines (64 MiB of minimal records: 4 million) is the line reader's.
MAX_ROWS = 200_000

_connection: tuple[int, object] | None = None  # (pid, DuckDB connection): a forked worker opens its own


def parse_to_table(path: str, keys: compact_records.Declared | None = None) -> pa.Table:
    """The file parsed by DuckDB into the columns declared in COLUMNS; NotColumnar where DuckDB cannot.
    `keys`: what a format 3 file's header declares: its readings' arrays become the columns format 2's
    objects gave, its attributes' indices the names (NotColumnar where a key is no declared index)."""
    global _connection
    try:
        import duckdb  # imported on first use: 0.5 s that only a journal needs
    except ImportError:  # vlmtrace upgraded without its report extra: the line reader reads it all
        raise NotColumnar("DuckDB is not installed") from None

    if _connection is None or _connection[0] != os.getpid():
        _connection = (
            os.getpid(),
            duckdb.connect(config={"threads": 1}),
        )  # a file per process; the cores are the workers'
    columns, selected = COLUMNS, "*"
    if keys is not None:
        if len(set(keys.attrs)) != len(keys.attrs):
            raise NotColumnar("a name declared twice in the header's attr_keys")
        columns = {**COLUMNS, "attrs": _struct(compact_columns.indexed(keys.attrs, ATTR_FIELDS))}
        columns.update(mem="JSON[]", mem0="JSON[]")
        selected = compact_columns.select(keys.mem, MEM_TYPES)
    connection: Any = _connection[1]
    try:
        table = connection.sql(
            f"SELECT {selected} FROM read_json(?, format = 'newline_delimited', records = true, columns = ?, "
            "maximum_object_size = ?)",
            params=[path, columns, MAX_LINE_BYTES],
        ).to_arrow_table()
        if keys is None:
            return table
        odd = connection.sql(compact_columns.odd_keys(keys.attrs), params=[path, MAX_LINE_BYTES]).fetchall()[0]
    except duckdb.Error as error:
        raise NotColumnar(str(error)) from None
    if odd[0]:
        raise NotColumnar("an attribute key that is no index the header declares")
    attrs = compact_columns.renamed(table["attrs"].combine_chunks(), ATTR_FIELDS)
    return table.set_column(table.column_names.index("attrs"), "attrs", attrs)


def _numbers(struct: pa.StructArray, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {key: struct.field(key).to_numpy(zero_copy_only=False) for key in keys}


def _times(column: pa.Array) -> np.ndarray:
    return column.fill_null(MISSING_TIME).to_numpy(zero_copy_only=False).astype(np.int64)


def _lines_at(descriptor: int, size: int, rows: list[int], row_count: int) -> dict[int, bytes]:
    """The lines of these rows (the header, and the few near the end: starts still open, the end
    marker), read from the file's first `size` bytes after checking that they hold exactly one line per
    row read. Read with `pread`, never mapped: a file cut short meanwhile (its writer rotating) ends the
    columnar read, where a mapped page past the new end would kill the process with SIGBUS."""
    wanted = sorted({0, *rows})
    needed = np.array(
        sorted({row - 1 for row in wanted if row} | set(wanted)), dtype=np.int64
    )  # newlines that bound them
    newline_at: dict[int, int] = {}
    counted, offset, last = 0, 0, b"\n"
    while offset < size:
        chunk = os.pread(descriptor, min(LINE_SCAN_BYTES, size - offset), offset)
        if not chunk:
            raise NotColumnar("the file was cut short while it was read")
        found = np.flatnonzero(np.frombuffer(chunk, np.uint8) == ord("\n"))
        low, high = np.searchsorted(needed, [counted, counted + len(found)])
        for index in needed[low:high].tolist():
            newline_at[index] = offset + int(found[index - counted])
        counted, offset, last = counted + len(found), offset + len(chunk), chunk[-1:]
    if counted + (size > 0 and last != b"\n") != row_count:
        raise NotColumnar("a blank line, or lines written since the file was parsed")
    lines = {}
    for row in wanted:
        start = newline_at[row - 1] + 1 if row else 0
        end = newline_at[row] + 1 if row in newline_at else size
        lines[row] = os.pread(descriptor, end - start, start)
    return lines


def _line_count(descriptor: int, size: int) -> int:
    count, offset = 0, 0
    while offset < size:
        chunk = os.pread(descriptor, min(LINE_SCAN_BYTES, size - offset), offset)
        if not chunk:
            break
        count += chunk.count(b"\n")
        offset += len(chunk)
    return count


def _text(values: pa.Array) -> pa.Array:
    """A JSON column as plain strings (DuckDB hands JSON over as an Arrow extension type)."""
    return values.storage if isinstance(values, pa.ExtensionArray) else values


def _unique(values: pa.Array) -> bool:
    present = values.drop_null()
    return pc.count_distinct(present).as_py() == len(present)


def read_columns(
    reader: JournalReader, source: str, path: str, limits: ReadLimits, handle: IO[bytes], size: int
) -> bool:
    """Read the journal file at `path`, open as `handle`, into `reader`'s TraceData as the line reader
    would, up to the `size` it had when opened; False, having added nothing, where only the line reader
    can (the file changed or went away while DuckDB parsed it included)."""
    try:
        _read(reader, source, path, limits, handle.fileno(), size)
    except NotColumnar:
        return False
    return True


def _finite(struct: pa.StructArray, keys: tuple[str, ...]) -> bool:
    """No NaN or infinity among these number fields: orjson (the line reader) refuses such a line as
    not JSON, and DuckDB accepts it; the line reader reads the file, so both paths agree."""
    return not any(pc.any(pc.invert(pc.is_finite(struct.field(key)))).as_py() for key in keys)


def _plain_text(column: dict[str, pa.Array], attrs: pa.StructArray, ends: np.ndarray) -> bool:
    """DuckDB casts an object or a list to its JSON text where a column is VARCHAR; the line reader
    skips such a record (typed.py). Ids are hex, and no text field of an end record holds JSON."""
    for name in ("trace_id", "span_id", "parent_id"):
        if pc.all(pc.match_substring_regex(column[name].take(ends), "^[0-9a-fA-F]+$")).as_py() not in (True, None):
            return False
    texts = [column[name].take(ends) for name in ("name", "status", "thread")] + [
        attrs.field(key).take(ends) for key in (sc.STAGE, sc.THREAD_NAME)
    ]
    return not any(pc.any(pc.match_substring_regex(values, r"^[\[{]")).as_py() for values in texts)


def _read(reader: JournalReader, source: str, path: str, limits: ReadLimits, descriptor: int, size: int) -> None:
    if size > min(MAX_FILE_BYTES, limits.input_bytes, limits.record_bytes * 1024):
        raise NotColumnar("a file larger than a few rotations")
    before = os.fstat(descriptor)
    if _line_count(descriptor, size) > MAX_ROWS:
        raise NotColumnar("more lines than the columns are built for at once")
    first = os.pread(descriptor, min(size, MAX_LINE_BYTES), 0).split(b"\n", 1)[0]
    try:
        header = orjson.loads(first)
    except orjson.JSONDecodeError:
        raise NotColumnar("a first line that is not a record") from None
    keys = compact_records.declared(header) if type(header) is dict else None
    table = parse_to_table(path, keys).combine_chunks()
    after = os.fstat(descriptor)
    if (after.st_size, after.st_mtime_ns) != (size, before.st_mtime_ns):
        raise NotColumnar("the file changed while DuckDB parsed it")
    if not table.num_rows:
        raise NotColumnar("no records")
    kinds = table["k"].chunk(0) if table["k"].num_chunks else pa.array([], pa.string())
    if kinds.null_count or not pc.all(pc.is_in(kinds, value_set=pa.array(KINDS))).as_py():
        raise NotColumnar("a record of another kind")
    kind = kinds.to_numpy(zero_copy_only=False)
    is_header = kind == "header"
    if not is_header[0] or is_header.sum() != 1:
        raise NotColumnar("a header other than the first line")
    if table.num_rows > limits.records:
        raise NotColumnar("more records than the bound")
    column = {name: table[name].chunk(0) for name in table.column_names}
    is_end, is_start = kind == "end", kind == "start"
    ends, starts = np.flatnonzero(is_end), np.flatnonzero(is_start)
    if len(ends) > limits.spans:
        raise NotColumnar("more spans than the bound")
    end_ids, start_ids = column["span_id"].take(ends), column["span_id"].take(starts)
    if not (_unique(end_ids) and _unique(start_ids)):
        raise NotColumnar("a span id twice")
    # Each end's start in this file: it must come before it, as the line reader pairs them.
    match = pc.index_in(end_ids, value_set=start_ids).to_numpy(zero_copy_only=False)
    matched = ~np.isnan(match) if match.dtype.kind == "f" else np.ones(len(match), bool)
    start_of_end = (
        np.where(matched, np.nan_to_num(match, nan=0), 0).astype(np.int64) if len(match) else np.zeros(0, np.int64)
    )
    if (starts[start_of_end[matched]] > ends[matched]).any():
        raise NotColumnar("an end before its start")
    if keys is not None and not compact_columns.completed(column, ends, starts, matched, start_of_end):
        raise NotColumnar("a compact end whose start is in another file, or a read time that is no integer")
    attrs, mem, mem0 = column["attrs"], column["mem"], column["mem0"]
    sample_attrs = column["sample"] if keys is not None else attrs
    if not (
        _finite(attrs, NUMBER_KEYS)
        and _finite(mem, MEM_KEYS)
        and _finite(mem0, MEM_KEYS)
        and (keys is None or _finite(sample_attrs, SAMPLE_NUMERIC_KEYS))
    ):
        raise NotColumnar("NaN or infinity")
    for devices in (attrs.field(sc.MEM_DEVICES), mem.field(sc.MEM_DEVICES)):
        if pc.any(pc.match_substring(_text(devices), ",")).as_py():
            raise NotColumnar("per-device readings")  # DeviceColumns' long form is built record by record
    if not _plain_text(column, attrs, ends):
        raise NotColumnar("an id that is not hex, or an object or list where text belongs")
    unmatched_starts = np.setdiff1d(np.arange(len(starts)), start_of_end[matched])
    unmatched_starts = unmatched_starts[
        column["span_id"].take(starts[unmatched_starts]).is_valid().to_numpy(zero_copy_only=False)
    ]
    notes = np.flatnonzero(np.isin(kind, NOTE_KINDS))
    if len(notes) > WARNINGS_KEPT:
        raise NotColumnar("more notes than are kept")  # the line reader keeps WARNINGS_KEPT and counts the rest
    lines = _lines_at(descriptor, size, sorted({*notes.tolist(), *starts[unmatched_starts].tolist()}), table.num_rows)

    if type(header) is not dict or not (
        header.get("v") is None or (type(header.get("v")) is int and header["v"] in KNOWN_VERSIONS)
    ):
        raise NotColumnar("a journal format version this reader does not know")

    # Nothing is added before this point: from here on, the file is read.
    data = reader.data
    process, pending = reader.header(header, source, 1, set())
    end_attrs, end_mem, end_mem0 = attrs.take(ends), mem.take(ends), mem0.take(ends)
    start_thread = column["thread"].take(starts[start_of_end]) if len(starts) else pa.nulls(len(ends), pa.string())
    thread = pc.coalesce(
        pc.if_else(pa.array(matched, pa.bool_()), start_thread, pa.scalar(None, pa.string())),
        end_attrs.field(sc.THREAD_NAME),
    )
    if pending:
        thread = _threads_from_earlier_files(thread, end_ids, matched, pending)
    values, from_mem = _numbers(end_attrs, SPAN_MEMORY_KEYS), _numbers(end_mem, MEM_KEYS)
    from_mem0, with_mem0 = _numbers(end_mem0, MEM_KEYS), end_mem0.is_valid()
    read_at_start = pc.if_else(with_mem0, end_mem0.field(sc.MEM_READ_TIME), end_mem.field(sc.MEM_READ_TIME))
    from_mem[sc.MEM_READ_TIME + sc.DELTA_SUFFIX] = pc.subtract(  # in integers, as the line reader works it out
        end_mem.field(sc.MEM_READ_TIME), read_at_start
    ).to_numpy(zero_copy_only=False)
    has_mem0 = with_mem0.to_numpy(zero_copy_only=False)
    memory = np.empty((len(ends), len(SPAN_MEMORY_KEYS)))
    for index, key in enumerate(SPAN_MEMORY_KEYS):
        base = key.removesuffix(sc.DELTA_SUFFIX)
        if key in from_mem:
            derived = from_mem[key]
        else:
            derived = from_mem[base] - np.where(has_mem0, from_mem0[base], from_mem[base])
        memory[:, index] = np.where(np.isnan(values[key]), derived, values[key])  # the record's attributes win
    stage = end_attrs.field(sc.STAGE)
    with_features = pc.fill_null(pc.is_in(stage, value_set=pa.array(sorted(FEATURE_STAGES))), False).to_numpy(
        zero_copy_only=False
    )
    with_features |= stage.is_null().to_numpy(zero_copy_only=False) & end_attrs.field(
        sc.GEN_AI_USAGE_INPUT_TOKENS
    ).is_valid().to_numpy(zero_copy_only=False)
    feature_rows = np.flatnonzero(with_features)
    featured = end_attrs.take(feature_rows)
    features = (
        np.column_stack([featured.field(key).to_numpy(zero_copy_only=False) for key in FEATURE_KEYS])
        if len(feature_rows)
        else np.empty((0, len(FEATURE_KEYS)))
    )
    strings = [column[name].take(ends) for name in ("trace_id", "span_id", "parent_id", "name", "status")] + [
        stage,
        thread,
    ]
    times = np.column_stack([_times(column["start"].take(ends)), _times(column["t"].take(ends))])
    data.spans.add_block(process, strings, times, memory, features.astype(np.float64), feature_rows)
    samples = np.flatnonzero(kind == "sample")
    if len(samples):
        sample_attrs = sample_attrs.take(samples)
        numbers = np.column_stack(
            [sample_attrs.field(key).to_numpy(zero_copy_only=False) for key in SAMPLE_NUMERIC_KEYS]
        )
        data.samples.add_block(
            process,
            _times(column["t"].take(samples)),
            numbers.astype(np.float64),
            {key: _carried(sample_attrs.field(key)) for key in SAMPLE_JSON_KEYS},
        )
    waiting = starts[unmatched_starts].tolist()
    if keys is not None:
        lines.update(compact_columns.linked_lines(lines, unmatched_starts, starts, column))
    for row in waiting:
        reader.wait_for_end(pending, column["span_id"][row].as_py(), lines[row])
    reader.note_let_go(source)
    budget.current().check()  # the bounds on what is kept (spans, samples) hold as for the line reader
    for row in notes[1:].tolist():
        if kind[row] == "end_marker":
            data.processes[process].clean_end = True
            data.processes[process].ended_by = ended_by(orjson.loads(lines[row]))
        else:
            reader.note(orjson.loads(lines[row]), kind[row], process, source, row + 1)
    timed = np.flatnonzero(np.isin(kind, TIMED_KINDS))
    last_t = column["t"][int(timed[-1])].as_py() if len(timed) else None
    if isinstance(last_t, int):
        info = data.processes[process]
        info.last_record_ns = max(info.last_record_ns or last_t, last_t)


def _carried(values: pa.Array) -> list[tuple[int, Any]]:
    """(row, value) of the samples that carry a JSON attribute (the heap counter's, in few processes' samples)."""
    return [
        (int(row), typed.cut_deep(orjson.loads(values[int(row)].as_py()), "a sample's heap reading"))
        for row in np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
    ]


def _threads_from_earlier_files(
    thread: pa.Array, end_ids: pa.Array, matched: np.ndarray, pending: dict[str, bytes]
) -> pa.Array:
    """Ends whose start record an earlier file left waiting (read by this reader): their start's thread."""
    waiting = np.flatnonzero(
        ~matched & pc.is_in(end_ids, value_set=pa.array(list(pending), pa.string())).to_numpy(zero_copy_only=False)
    )
    if not len(waiting):
        return thread
    threads = thread.to_pylist()
    for row in waiting.tolist():
        found = thread_of(pending.pop(end_ids[row].as_py()))
        if found is not None:
            threads[row] = found
    return pa.array(threads, pa.string())
