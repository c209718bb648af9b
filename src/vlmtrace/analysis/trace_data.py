"""The normalised form every reader fills: columns of spans and memory readings, plus what went wrong.

Readers append one row per ended span or memory sample; rows are turned into numpy/pyarrow blocks
every few thousand rows, so a million spans never exist as a million Python objects at once.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vlmtrace import semconv as sc

CHUNK_ROWS = 16384
MISSING_TIME = np.iinfo(np.int64).min

# Memory readings present on span end records and on samples (value at that moment).
MEM_VALUE_KEYS = (
    sc.MEM_TORCH_ALLOCATED,
    sc.MEM_TORCH_RESERVED,
    sc.MEM_TORCH_INACTIVE_SPLIT,
    sc.MEM_TORCH_ALLOC_RETRIES,
    sc.MEM_TORCH_OOMS,
    sc.MEM_GPU_PROCESS,
    sc.MEM_GPU_USED,
    sc.MEM_GPU_TOTAL,
    sc.MEM_NATIVE,
    sc.MEM_HOST_RSS,
    sc.MEM_READ_TIME,
)
# Deltas kept: those of the readings the components are made of, to place each span's start reading.
MEM_DELTA_KEYS = tuple(
    key + sc.DELTA_SUFFIX
    for key in (sc.MEM_TORCH_ALLOCATED, sc.MEM_TORCH_RESERVED, sc.MEM_GPU_PROCESS, sc.MEM_NATIVE, sc.MEM_HOST_RSS, sc.MEM_READ_TIME)
)
# Input features and load facts, read from whichever span carries them.
FEATURE_KEYS = (
    sc.REQUEST_IMAGES,
    sc.REQUEST_IMAGE_PIXELS,
    sc.GEN_AI_USAGE_INPUT_TOKENS,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS,
    sc.VISION_IMAGES,
    sc.VISION_PIXELS,
    sc.VISION_TOKENS,
    sc.VISION_MAX_BATCH_SIZE,
    sc.PIPELINE_PROMPTS,
    sc.PIPELINE_IMAGES,
    sc.STEP_SEQUENCES,
    sc.STEP_TOKENS,
    sc.REQUEST_PREPROCESS_DURATION,
    *sc.PROMPT_END_KEYS.values(),
)
SPAN_MEMORY_KEYS = MEM_VALUE_KEYS + MEM_DELTA_KEYS
NO_FEATURES = (float("nan"),) * len(FEATURE_KEYS)
# Stages whose spans carry input features; spans without a stage are checked by their GenAI attributes.
FEATURE_STAGES = frozenset({sc.STAGE_PIPELINE, sc.STAGE_REQUEST, sc.STAGE_VISION_PREPROCESS})
SAMPLE_NUMERIC_KEYS = MEM_VALUE_KEYS + (
    sc.LMDEPLOY_TM_ACTIVE_SEQS,
    sc.LMDEPLOY_TM_WAITING_SEQS,
    sc.LMDEPLOY_TM_CACHE_USAGE,
)
DEVICE_KEYS = (
    sc.MEM_TORCH_ALLOCATED,
    sc.MEM_TORCH_RESERVED,
    sc.MEM_GPU_PROCESS,
    sc.MEM_GPU_USED,
    sc.MEM_GPU_TOTAL,
    sc.MEM_NATIVE,
)
SPAN_STRING_COLUMNS = ("trace_id", "span_id", "parent_id", "name", "status", "stage", "thread")
CATEGORICAL_COLUMNS = frozenset({"name", "stage", "status", "thread"})


def _to_float(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return float("nan")
    return float("nan")


def _to_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) < value < 2**63:
        return value
    return int(MISSING_TIME)


def _to_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return str(value)


def _float_block(rows: list[tuple], width: int, integers: bool) -> np.ndarray:
    """Rows of numbers as a float64 matrix, NaN where a value is absent or not a number.

    For columns of counts and bytes (`integers`), numpy's int64 conversion is tried first: it is twice
    as fast as converting Python ints to float64 (a fraction in such a column would be truncated).
    """
    for dtype in (np.int64, np.float64) if integers else (np.float64,):
        try:
            block = np.array(rows, dtype=dtype)
        except (TypeError, ValueError, OverflowError):
            continue
        if block.shape == (len(rows), width):
            return block.astype(np.float64, copy=False)
    return np.array([[_to_float(v) for v in row] for row in rows], dtype=np.float64)


class _FloatRows:
    """Fixed-width rows of optional numbers → one float64 matrix (NaN where absent or not a number)."""

    def __init__(self, width: int, integers: bool = False) -> None:
        self.width = width
        self.integers = integers
        self._rows: list[tuple] = []
        self._blocks: list[np.ndarray] = []

    def append(self, row: tuple) -> None:
        self._rows.append(row)
        if len(self._rows) >= CHUNK_ROWS:
            self._flush()

    def add_rows(self, rows: list[tuple]) -> None:
        """A chunk of rows at once, converted straight to a block."""
        self._flush()
        self._rows = rows
        self._flush()

    def add_block(self, block: np.ndarray) -> None:
        """Rows already converted (float64, `width` columns)."""
        self._flush()
        self._blocks.append(block)

    def _flush(self) -> None:
        if not self._rows:
            return
        self._blocks.append(_float_block(self._rows, self.width, self.integers))
        self._rows = []

    def finish(self) -> np.ndarray:
        """The matrix; the blocks are let go (once: a second call returns no rows)."""
        self._flush()
        blocks, self._blocks = self._blocks, []
        if not blocks:
            return np.empty((0, self.width), dtype=np.float64)
        return np.concatenate(blocks)

    def absorb(self, other: _FloatRows) -> None:
        self._flush()
        other._flush()
        self._blocks.extend(other._blocks)


class _IntColumn:
    def __init__(self) -> None:
        self._values: list = []
        self._blocks: list[np.ndarray] = []

    def append(self, value: Any) -> None:
        self._values.append(value)
        if len(self._values) >= CHUNK_ROWS:
            self._flush()

    def add_values(self, values: list) -> None:
        self._flush()
        self._values = values
        self._flush()

    def add_block(self, block: np.ndarray) -> None:
        """Values already converted (int64)."""
        self._flush()
        self._blocks.append(block)

    def _flush(self) -> None:
        if not self._values:
            return
        self._blocks.append(_int_block(self._values))
        self._values = []

    def finish(self) -> np.ndarray:
        """The column; the blocks are let go (once: a second call returns no rows)."""
        self._flush()
        blocks, self._blocks = self._blocks, []
        return np.concatenate(blocks) if blocks else np.empty(0, dtype=np.int64)

    def absorb(self, other: _IntColumn, offset: int = 0) -> None:
        self._flush()
        other._flush()
        self._blocks.extend(block + offset for block in other._blocks)


def _int_block(values: list) -> np.ndarray:
    """Integers as int64; anything else becomes MISSING_TIME."""
    try:
        block = np.array(values, dtype=np.int64)
        if block.ndim != 1:
            raise ValueError("not a flat list of integers")
        return block
    except (TypeError, ValueError, OverflowError):
        return np.array([_to_int(v) for v in values], dtype=np.int64)


def _string_array(values: tuple | list) -> pa.Array:
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowException, TypeError, ValueError):
        return pa.array([_to_str(v) for v in values], type=pa.string())


class _ProcessRuns:
    """The process index of each row, stored as runs because it changes only between files."""

    def __init__(self) -> None:
        self._values: list[int] = []
        self._lengths: list[int] = []

    def extend(self, process: int, count: int = 1) -> None:
        if self._values and self._values[-1] == process:
            self._lengths[-1] += count
        else:
            self._values.append(process)
            self._lengths.append(count)

    def finish(self) -> np.ndarray:
        return np.repeat(np.array(self._values, dtype=np.int32), np.array(self._lengths, dtype=np.int64))

    def absorb(self, other: _ProcessRuns, process_map: dict[int, int]) -> None:
        for value, length in zip(other._values, other._lengths):
            self.extend(process_map[value], length)


# The journal end record's own fields, in the order of SPAN_HEAD_COLUMNS.
JOURNAL_HEAD_KEYS = ("trace_id", "span_id", "parent_id", "name", "status", "start", "t")
SPAN_HEAD_COLUMNS = ("trace_id", "span_id", "parent_id", "name", "status", "start_ns", "end_ns")
# Reading every memory key in one C call fails when a writer leaves some out (no torch): after this
# many failures the builder looks them up one by one instead.
MISSES_BEFORE_LOOKUPS = 256


class SpanColumns:
    """Ended spans: ids, names, times, memory readings, and the input features of the spans that have them.

    One tuple per span per group of columns; every CHUNK_ROWS spans the tuples become arrays.
    """

    def __init__(self) -> None:
        self.count = 0
        self._heads: list[tuple] = []
        self._stages: list = []
        self._threads: list = []
        self._memory: list[tuple] = []
        self._all_memory: Callable[[dict], tuple] | None = operator.itemgetter(*SPAN_MEMORY_KEYS)
        self._memory_misses = 0
        self._features: list[tuple] = []
        self._feature_rows: list[int] = []
        self._feature_blocks = _FloatRows(len(FEATURE_KEYS))
        self._feature_row_blocks = _IntColumn()
        self._string_chunks: list[list[pa.Array]] = []
        self._time_blocks: list[np.ndarray] = []
        self._memory_blocks = _FloatRows(len(SPAN_MEMORY_KEYS), integers=True)
        self._process_changes: list[tuple[int, int]] = []  # (first row, process), one per change
        self._last_process = -1

    def append(
        self,
        process: int,
        trace_id: Any,
        span_id: Any,
        parent_id: Any,
        name: Any,
        status: Any,
        start_ns: Any,
        end_ns: Any,
        attributes: dict,
    ) -> None:
        self.append_head(process, (trace_id, span_id, parent_id or None, name, status, start_ns, end_ns), attributes)

    def append_head(self, process: int, head: tuple, attributes: dict) -> None:
        """A span whose own fields are already in SPAN_HEAD_COLUMNS order (the journal's hot path)."""
        self._heads.append(head)
        stage = attributes.get(sc.STAGE)
        self._stages.append(stage)
        self._threads.append(attributes.get(sc.THREAD_NAME))
        all_memory = self._all_memory
        if all_memory is not None:
            try:
                self._memory.append(all_memory(attributes))
            except KeyError:
                self._memory.append(tuple(map(attributes.get, SPAN_MEMORY_KEYS)))
                self._memory_misses += 1
                if self._memory_misses >= MISSES_BEFORE_LOOKUPS:
                    self._all_memory = None
        else:
            self._memory.append(tuple(map(attributes.get, SPAN_MEMORY_KEYS)))
        if stage in FEATURE_STAGES or (stage is None and sc.GEN_AI_USAGE_INPUT_TOKENS in attributes):
            self._feature_rows.append(self.count)
            self._features.append(tuple(map(attributes.get, FEATURE_KEYS, NO_FEATURES)))
        if process != self._last_process:
            self._last_process = process
            self._process_changes.append((self.count, process))
        self.count += 1
        if len(self._heads) >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._heads:
            return
        columns = list(zip(*self._heads))
        self._string_chunks.append([_string_array(column) for column in columns[:5]] + [_string_array(self._stages), _string_array(self._threads)])
        self._time_blocks.append(np.column_stack([_int_block(list(columns[5])), _int_block(list(columns[6]))]))
        self._memory_blocks.add_rows(self._memory)
        self._feature_blocks.add_rows(self._features)
        self._feature_row_blocks.add_values(self._feature_rows)
        self._heads, self._stages, self._threads, self._memory, self._features, self._feature_rows = [], [], [], [], [], []

    def _processes(self) -> np.ndarray:
        if not self._process_changes:
            return np.zeros(0, dtype=np.int32)
        firsts, processes = (np.array(values, dtype=np.int64) for values in zip(*self._process_changes))
        return np.repeat(processes.astype(np.int32), np.diff(np.append(firsts, self.count)))

    def add_block(self, process: int, strings: list[pa.Array], times: np.ndarray, memory: np.ndarray,
                  features: np.ndarray, feature_rows: np.ndarray) -> None:
        """Spans read as columns (a journal file read by DuckDB): `strings` in SPAN_STRING_COLUMNS order,
        `times` start and end (n × 2, int64), `memory` SPAN_MEMORY_KEYS (n × k, float64), and FEATURE_KEYS
        for the rows `feature_rows` (numbered within the block)."""
        self._flush()
        if not len(times):
            return
        self._string_chunks.append([array.cast(pa.string()) for array in strings])
        self._time_blocks.append(times)
        self._memory_blocks.add_block(memory)
        self._feature_blocks.add_block(features)
        self._feature_row_blocks.add_block(feature_rows.astype(np.int64) + self.count)
        if process != self._last_process:
            self._last_process = process
            self._process_changes.append((self.count, process))
        self.count += len(times)

    def rows_with_ids(self, ids: pa.Array) -> tuple[np.ndarray, list[str], np.ndarray]:
        """The rows whose span id is one of `ids`: their row numbers, span ids and processes."""
        self._flush()
        if not self._string_chunks or not len(ids):
            return np.zeros(0, np.int64), [], np.zeros(0, np.int32)
        span_ids = pa.chunked_array([chunk[SPAN_STRING_COLUMNS.index("span_id")] for chunk in self._string_chunks], type=pa.string())
        rows = np.flatnonzero(pc.is_in(span_ids, value_set=ids).to_numpy(zero_copy_only=False))
        return rows, span_ids.take(rows).to_pylist(), self._processes()[rows]

    def set_threads(self, threads: dict[int, str]) -> None:
        """Set the thread of the spans at these rows (their start records were read by another reader)."""
        self._flush()
        column, first = SPAN_STRING_COLUMNS.index("thread"), 0
        for chunk in self._string_chunks:
            mine = {row - first: thread for row, thread in threads.items() if first <= row < first + len(chunk[column])}
            if mine:
                values = chunk[column].to_pylist()
                for row, thread in mine.items():
                    values[row] = thread
                chunk[column] = _string_array(values)
            first += len(chunk[column])

    def absorb(self, other: SpanColumns, process_map: dict[int, int]) -> None:
        """Append another builder's spans (read in another process), renumbering its processes."""
        self._flush()
        other._flush()
        self._string_chunks.extend(other._string_chunks)
        self._time_blocks.extend(other._time_blocks)
        self._memory_blocks.absorb(other._memory_blocks)
        self._feature_blocks.absorb(other._feature_blocks)
        self._feature_row_blocks.absorb(other._feature_row_blocks, offset=self.count)
        self._process_changes.extend((row + self.count, process_map[process]) for row, process in other._process_changes)
        self._last_process = -1
        self.count += other.count

    def finish(self) -> pd.DataFrame:
        """The spans as one frame, built once: the builder lets go of its blocks as they are copied in
        (a million spans' blocks would otherwise be held twice), and keeps only its count."""
        self._flush()
        frame = pd.DataFrame(self._memory_blocks.finish(), columns=list(SPAN_MEMORY_KEYS), copy=False)
        string_chunks, self._string_chunks = self._string_chunks, []
        for position, name in enumerate(SPAN_STRING_COLUMNS):
            array = pa.chunked_array([chunk[position] for chunk in string_chunks], type=pa.string())
            if name in CATEGORICAL_COLUMNS:
                frame[name] = pd.Categorical.from_codes(*_dictionary(array))
            else:
                frame[name] = pd.Series(array, dtype=pd.ArrowDtype(pa.string()))
            for chunk in string_chunks:
                chunk[position] = None
        time_blocks, self._time_blocks = self._time_blocks, []
        times = np.concatenate(time_blocks) if time_blocks else np.empty((0, 2), dtype=np.int64)
        del time_blocks
        frame["start_ns"] = times[:, 0]
        frame["end_ns"] = times[:, 1]
        frame["process"] = self._processes()
        feature_values = self._feature_blocks.finish()
        rows = self._feature_row_blocks.finish()
        for index, key in enumerate(FEATURE_KEYS):
            column = np.full(self.count, np.nan)
            column[rows] = feature_values[:, index]
            frame[key] = column
        return frame


def _dictionary(array: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """Codes and categories of a string column (−1 for null), for a compact pandas Categorical."""
    encoded = array.combine_chunks().dictionary_encode() if len(array) else pa.array([], pa.string()).dictionary_encode()
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, encoded.dictionary.to_pylist()


class SampleColumns:
    """Background memory samples (journal only): one row per reading."""

    def __init__(self) -> None:
        self.count = 0
        self._numbers = _FloatRows(len(SAMPLE_NUMERIC_KEYS))
        self._time = _IntColumn()
        self._process = _ProcessRuns()

    def append(self, process: int, t_ns: Any, attributes: dict) -> None:
        self._numbers.append(tuple(map(attributes.get, SAMPLE_NUMERIC_KEYS)))
        self._time.append(t_ns)
        self._process.extend(process)
        self.count += 1

    def add_block(self, process: int, t_ns: np.ndarray, numbers: np.ndarray) -> None:
        """Samples read as columns: times (int64) and SAMPLE_NUMERIC_KEYS (n × k, float64)."""
        self._numbers.add_block(numbers)
        self._time.add_block(t_ns)
        self._process.extend(process, len(t_ns))
        self.count += len(t_ns)

    def absorb(self, other: SampleColumns, process_map: dict[int, int]) -> None:
        self._numbers.absorb(other._numbers)
        self._time.absorb(other._time)
        self._process.absorb(other._process, process_map)
        self.count += other.count

    def finish(self) -> pd.DataFrame:
        columns: dict[str, Any] = {"t_ns": self._time.finish(), "process": self._process.finish()}
        numbers = self._numbers.finish()
        for index, key in enumerate(SAMPLE_NUMERIC_KEYS):
            columns[key] = numbers[:, index]
        return pd.DataFrame(columns)


class DeviceColumns:
    """Per-device readings (from `….per_device` arrays), long form: one row per device per reading."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []

    def append(self, process: int, t_ns: Any, attributes: dict) -> None:
        devices = attributes.get(sc.MEM_DEVICES)
        if not isinstance(devices, list) or len(devices) < 2:
            return
        arrays = [attributes.get(key + sc.PER_DEVICE_SUFFIX) for key in DEVICE_KEYS]
        for position, device in enumerate(devices):
            values = tuple(
                _to_float(array[position]) if isinstance(array, list) and position < len(array) else float("nan")
                for array in arrays
            )
            self._rows.append((process, _to_int(t_ns), _to_int(device)) + values)

    def absorb(self, other: DeviceColumns, process_map: dict[int, int]) -> None:
        self._rows.extend((process_map[row[0]],) + row[1:] for row in other._rows)

    def finish(self) -> pd.DataFrame:
        frame = pd.DataFrame(self._rows, columns=["process", "t_ns", "device", *DEVICE_KEYS])
        return frame.astype({"process": np.int32, "t_ns": np.int64, "device": np.int64})


MAX_PROBLEMS_PER_SOURCE = 100


@dataclasses.dataclass
class Problem:
    """Something a reader skipped or could not read: named by file and line so a person can look."""

    source: str
    line: int | None
    reason: str
    severity: str = "error"  # "error": bad input (exit code 2); "note": expected after a crash

    def describe(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.reason}"


@dataclasses.dataclass
class ProcessInfo:
    label: str
    host: str | None = None
    pid: int | None = None
    service: str | None = None
    resource: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    argv: list = dataclasses.field(default_factory=list)
    from_journal: bool = False
    clean_end: bool = False
    end_unread: bool = False  # the journal could not be read to its end (cut-off or over-large gzip)
    last_record_ns: int | None = None
    sources: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class InFlightSpan:
    """A span with a journal start record and no end record: running when the process stopped."""

    process: int
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int | None
    kind: str | None
    thread: str | None
    attributes: dict
    links: list


@dataclasses.dataclass
class FatalBlock:
    """faulthandler's plain-text report, found after the last JSON record of a journal."""

    process: int
    source: str
    line: int
    text: str


@dataclasses.dataclass
class InputInfo:
    source: str
    format: str
    spans: int = 0
    samples: int = 0


class TraceData:
    """Everything read from all inputs, in one normalised form."""

    def __init__(self) -> None:
        self.spans = SpanColumns()
        self.samples = SampleColumns()
        self.devices = DeviceColumns()
        self.processes: list[ProcessInfo] = []
        self._process_by_label: dict[str, int] = {}
        self.in_flight: list[InFlightSpan] = []
        self.fatal: list[FatalBlock] = []
        self.problems: list[Problem] = []
        self._problem_counts: dict[str, int] = {}
        self._problem_overflow: dict[str, Problem] = {}
        self.inputs: list[InputInfo] = []
        self.warnings: list[dict] = []
        self.dropped: dict[str, int] = {}
        self.snapshots: list[Any] = []

    def process(self, label: str, **facts: Any) -> int:
        """Index of the process called `label`, created on first sight; later facts fill blanks."""
        index = self._process_by_label.get(label)
        if index is None:
            index = len(self.processes)
            self._process_by_label[label] = index
            self.processes.append(ProcessInfo(label=label))
        info = self.processes[index]
        for key, value in facts.items():
            if value is not None and not getattr(info, key):
                setattr(info, key, value)
        return index

    def merge_processes(self, part: TraceData) -> dict[int, int]:
        """The processes another TraceData read (a later file, read in another process) merged into these,
        as if read here; returns its process numbering in this one."""
        process_map: dict[int, int] = {}
        for index, info in enumerate(part.processes):
            target = self.process(
                info.label, host=info.host, pid=info.pid, service=info.service, resource=info.resource,
                versions=info.versions, argv=info.argv, from_journal=info.from_journal or None,
            )
            mine = self.processes[target]
            mine.clean_end = mine.clean_end or info.clean_end
            mine.end_unread = mine.end_unread or info.end_unread
            if info.last_record_ns is not None:
                mine.last_record_ns = max(mine.last_record_ns or info.last_record_ns, info.last_record_ns)
            mine.sources.extend(source for source in info.sources if source not in mine.sources)
            process_map[index] = target
        return process_map

    def absorb(self, part: TraceData, process_map: dict[int, int]) -> None:
        """Append the rest of what `part` read, its processes numbered by `merge_processes`."""
        self.spans.absorb(part.spans, process_map)
        self.samples.absorb(part.samples, process_map)
        self.devices.absorb(part.devices, process_map)
        self.problems.extend(part.problems)
        for source, count in part._problem_counts.items():
            self._problem_counts[source] = self._problem_counts.get(source, 0) + count
        self._problem_overflow.update(part._problem_overflow)
        for span in part.in_flight:
            span.process = process_map[span.process]
            self.in_flight.append(span)
        for block in part.fatal:
            block.process = process_map[block.process]
            self.fatal.append(block)
        self.inputs.extend(part.inputs)
        self.warnings.extend(part.warnings)
        for key, value in part.dropped.items():
            self.dropped[key] = max(self.dropped.get(key, 0), value)
        self.snapshots.extend(part.snapshots)

    def add_span(
        self,
        process: int,
        trace_id: Any,
        span_id: Any,
        parent_id: Any,
        name: Any,
        status: Any,
        start_ns: Any,
        end_ns: Any,
        attributes: dict,
    ) -> None:
        """An ended span, with its per-device readings when it has them."""
        self.spans.append(process, trace_id, span_id, parent_id, name, status, start_ns, end_ns, attributes)
        if sc.MEM_DEVICES in attributes:
            self.devices.append(process, end_ns, attributes)

    def problem(self, source: str, line: int | None, reason: str, severity: str = "error") -> None:
        """Record a problem; past MAX_PROBLEMS_PER_SOURCE in one file, one entry stands for the rest
        (a single line can hold a million malformed records)."""
        count = self._problem_counts[source] = self._problem_counts.get(source, 0) + 1
        if count <= MAX_PROBLEMS_PER_SOURCE:
            self.problems.append(Problem(source, line, reason, severity))
        elif count == MAX_PROBLEMS_PER_SOURCE + 1:
            self._problem_overflow[source] = Problem(source, None, f"more than {MAX_PROBLEMS_PER_SOURCE} problems; the rest are not listed", severity)
            self.problems.append(self._problem_overflow[source])
        elif severity == "error":
            self._problem_overflow[source].severity = "error"
