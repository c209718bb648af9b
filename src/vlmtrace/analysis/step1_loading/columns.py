"""The builders of the span, sample and device tables: readers append one row per ended span or memory
sample (or a block of rows read as columns), and `finish` makes each table one frame.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vlmtrace import semconv as sc
from vlmtrace.analysis.step1_loading.column_keys import (
    CATEGORICAL_COLUMNS,
    DEVICE_KEYS,
    FEATURE_KEYS,
    FEATURE_STAGES,
    HEAP_KEYS,
    NO_FEATURES,
    SAMPLE_JSON_KEYS,
    SAMPLE_NUMERIC_KEYS,
    SPAN_MEMORY_KEYS,
    SPAN_STRING_COLUMNS,
)
from vlmtrace.analysis.step1_loading.row_blocks import (
    CHUNK_ROWS,
    FloatRows,
    IntColumn,
    ProcessRuns,
    int_block,
    string_array,
    to_float,
    to_int,
)
from vlmtrace.analysis.step1_loading.span_features import SpanFeatures

# Reading every memory key in one C call fails when a writer leaves some out (no torch): after this
# many failures the builder looks them up one by one instead.
MISSES_BEFORE_LOOKUPS = 256
# Devices kept of one reading: a node has at most 16 GPUs; a reading naming more is not a real one's.
MAX_DEVICES = 64


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
        self._all_memory: Callable[[dict], tuple] | None = operator.itemgetter(*SPAN_MEMORY_KEYS[: -len(HEAP_KEYS)])
        self._memory_misses = 0
        self._features: list[tuple] = []
        self._feature_rows: list[int] = []
        self._feature_blocks = FloatRows(len(FEATURE_KEYS))
        self._feature_row_blocks = IntColumn()
        self._string_chunks: list[list[pa.Array]] = []
        self._time_blocks: list[np.ndarray] = []
        self._memory_blocks = FloatRows(len(SPAN_MEMORY_KEYS), integers=True)
        self._process_changes: list[tuple[int, int]] = []  # (first row, process), one per change
        self._last_process = -1

    def append_head(self, process: int, head: tuple, attributes: dict) -> None:
        """An ended span, its own fields one tuple in SPAN_HEAD_COLUMNS order (the journal reader takes them
        from a record with one itemgetter call)."""
        self._heads.append(head)
        stage = attributes.get(sc.STAGE)
        self._stages.append(stage)
        self._threads.append(attributes.get(sc.THREAD_NAME))
        all_memory = self._all_memory
        if all_memory is not None:
            try:
                self._memory.append(all_memory(attributes) + tuple(map(attributes.get, HEAP_KEYS)))
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
        columns = list(zip(*self._heads, strict=True))
        self._string_chunks.append(
            [string_array(column) for column in columns[:5]] + [string_array(self._stages), string_array(self._threads)]
        )
        self._time_blocks.append(np.column_stack([int_block(list(columns[5])), int_block(list(columns[6]))]))
        self._memory_blocks.add_chunk(self._memory)
        self._feature_blocks.add_chunk(self._features)
        self._feature_row_blocks.add_chunk(self._feature_rows)
        self._heads, self._stages, self._threads, self._memory, self._features, self._feature_rows = (
            [],
            [],
            [],
            [],
            [],
            [],
        )

    def _processes(self) -> np.ndarray:
        if not self._process_changes:
            return np.zeros(0, dtype=np.int32)
        firsts, processes = (np.array(values, dtype=np.int64) for values in zip(*self._process_changes, strict=True))
        return np.repeat(processes.astype(np.int32), np.diff(np.append(firsts, self.count)))

    def add_block(
        self,
        process: int,
        strings: list[pa.Array],
        times: np.ndarray,
        memory: np.ndarray,
        features: np.ndarray,
        feature_rows: np.ndarray,
    ) -> None:
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
        span_ids = pa.chunked_array(
            [chunk[SPAN_STRING_COLUMNS.index("span_id")] for chunk in self._string_chunks], type=pa.string()
        )
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
                chunk[column] = string_array(values)
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
        self._process_changes.extend(
            (row + self.count, process_map[process]) for row, process in other._process_changes
        )
        self._last_process = -1
        self.count += other.count

    def finish(self) -> pd.DataFrame:
        """The spans as one frame, built once, without their input features (`take_features`): the builder
        lets go of its blocks as they are copied in (a million spans' blocks would otherwise be held twice),
        and keeps only its count."""
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
        return frame

    def take_features(self) -> SpanFeatures:
        """The input features (FEATURE_KEYS) of the spans that have them, by span row, each key kept only
        where a span has a value; the builder lets go of its blocks (`finish` leaves them out of the frame)."""
        self._flush()
        row_blocks, value_blocks = self._feature_row_blocks.take_blocks(), self._feature_blocks.take_blocks()
        assert [len(rows) for rows in row_blocks] == [len(values) for values in value_blocks], (
            "feature blocks out of step"
        )
        return SpanFeatures.from_blocks(FEATURE_KEYS, list(zip(row_blocks, value_blocks, strict=True)))


def _dictionary(array: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """Codes and categories of a string column (−1 for null), for a compact pandas Categorical."""
    encoded = (
        array.combine_chunks().dictionary_encode() if len(array) else pa.array([], pa.string()).dictionary_encode()
    )
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, encoded.dictionary.to_pylist()


class SampleColumns:
    """Background memory samples (journal only): one row per reading. The heap counter's readings of
    SAMPLE_JSON_KEYS (in few processes' samples) are kept apart, by row: `carried(key)`. A sample without
    any reading keeps nothing: it is counted in `empty`, not kept."""

    def __init__(self) -> None:
        self.count = 0
        self.empty = 0
        self._numbers = FloatRows(len(SAMPLE_NUMERIC_KEYS))
        self._time = IntColumn()
        self._process = ProcessRuns()
        self._carried: dict[str, list[tuple[int, Any]]] = {key: [] for key in SAMPLE_JSON_KEYS}  # key: [(row, value)]

    def append(self, process: int, t_ns: Any, attributes: dict) -> None:
        numbers = tuple(map(attributes.get, SAMPLE_NUMERIC_KEYS))
        carried = [
            (key, value) for key, kind in SAMPLE_JSON_KEYS.items() if isinstance(value := attributes.get(key), kind)
        ]
        if numbers.count(None) == len(numbers) and not carried:
            self.empty += 1
            return
        self._numbers.append(numbers)
        for key, value in carried:
            self._carried[key].append((self.count, value))
        self._time.append(t_ns)
        self._process.extend(process)
        self.count += 1

    def add_block(
        self,
        process: int,
        t_ns: np.ndarray,
        numbers: np.ndarray,
        carried: dict[str, list[tuple[int, Any]]] | None = None,
    ) -> None:
        """Samples read as columns: times (int64), SAMPLE_NUMERIC_KEYS (n × k, float64) and, per key of
        SAMPLE_JSON_KEYS, the rows of the block that carry it, with its value."""
        keep = ~np.isnan(numbers).all(axis=1)
        for rows in (carried or {}).values():
            keep[[row for row, _ in rows]] = True
        if not keep.all():
            self.empty += int(len(keep) - keep.sum())
            renumbered = np.cumsum(keep) - 1
            numbers, t_ns = numbers[keep], t_ns[keep]
            carried = {
                key: [(int(renumbered[row]), value) for row, value in rows] for key, rows in (carried or {}).items()
            }
        self._numbers.add_block(numbers)
        self._extend(carried or {}, self.count)
        self._time.add_block(t_ns)
        self._process.extend(process, len(t_ns))
        self.count += len(t_ns)

    def absorb(self, other: SampleColumns, process_map: dict[int, int]) -> None:
        self.empty += other.empty
        self._numbers.absorb(other._numbers)
        self._extend(other._carried, self.count)
        self._time.absorb(other._time)
        self._process.absorb(other._process, process_map)
        self.count += other.count

    def _extend(self, carried: dict[str, list[tuple[int, Any]]], offset: int) -> None:
        for key, rows in carried.items():
            self._carried[key].extend((offset + row, value) for row, value in rows)

    def finish(self) -> pd.DataFrame:
        columns: dict[str, Any] = {"t_ns": self._time.finish(), "process": self._process.finish()}
        numbers = self._numbers.finish()
        for index, key in enumerate(SAMPLE_NUMERIC_KEYS):
            columns[key] = numbers[:, index]
        return pd.DataFrame(columns)

    def carried(self, key: str) -> list[tuple[int, Any]]:
        """(row of finish()'s frame, value) of the samples that carry `key` (of SAMPLE_JSON_KEYS)."""
        return self._carried[key]


class DeviceColumns:
    """Per-device readings (from `….per_device` arrays), long form: one row per device per reading, of at
    most MAX_DEVICES devices per reading (the others are counted in `devices_cut`)."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self.devices_cut = 0

    def append(self, process: int, t_ns: Any, attributes: dict) -> None:
        devices = attributes.get(sc.MEM_DEVICES)
        if not isinstance(devices, list) or len(devices) < 2:
            return
        if len(devices) > MAX_DEVICES:
            self.devices_cut += len(devices) - MAX_DEVICES
            devices = devices[:MAX_DEVICES]
        arrays = [attributes.get(key + sc.PER_DEVICE_SUFFIX) for key in DEVICE_KEYS]
        for position, device in enumerate(devices):
            values = tuple(
                to_float(array[position]) if isinstance(array, list) and position < len(array) else float("nan")
                for array in arrays
            )
            self._rows.append((process, to_int(t_ns), to_int(device), *values))

    def absorb(self, other: DeviceColumns, process_map: dict[int, int]) -> None:
        self.devices_cut += other.devices_cut
        self._rows.extend((process_map[row[0]], *row[1:]) for row in other._rows)

    def finish(self) -> pd.DataFrame:
        frame = pd.DataFrame(self._rows, columns=["process", "t_ns", "device", *DEVICE_KEYS])
        return frame.astype({"process": np.int32, "t_ns": np.int64, "device": np.int64})
