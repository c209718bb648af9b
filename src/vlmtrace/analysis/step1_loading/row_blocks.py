"""Rows of Python values turned into numpy/pyarrow blocks every CHUNK_ROWS rows, so a million spans never
exist as a million Python objects at once; values that are not numbers become NaN or MISSING_TIME.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from vlmtrace.analysis.step1_loading.column_keys import MISSING_TIME

CHUNK_ROWS = 16384


def to_float(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return float("nan")
    return float("nan")


def to_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) < value < 2**63:
        return value
    return int(MISSING_TIME)


def _to_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return str(value)


def _float_block(rows: list[tuple], width: int, integers: bool) -> np.ndarray:
    """Rows of numbers as a 2-D float64 array, NaN where a value is absent or not a number.

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
    return np.array([[to_float(v) for v in row] for row in rows], dtype=np.float64)


class _Blocks:
    """Values appended one at a time or a chunk at once; every CHUNK_ROWS values become one numpy block."""

    def __init__(self) -> None:
        self._pending: list = []
        self._blocks: list[np.ndarray] = []

    def _convert(self, values: list) -> np.ndarray:
        raise NotImplementedError

    def append(self, value: Any) -> None:
        self._pending.append(value)
        if len(self._pending) >= CHUNK_ROWS:
            self._flush()

    def add_chunk(self, values: list) -> None:
        """A chunk of values at once, converted straight to a block."""
        self._flush()
        self._pending = values
        self._flush()

    def add_block(self, block: np.ndarray) -> None:
        """Values already converted (of the dtype and width that `finish` returns)."""
        self._flush()
        self._blocks.append(block)

    def _flush(self) -> None:
        if not self._pending:
            return
        self._blocks.append(self._convert(self._pending))
        self._pending = []

    def take_blocks(self) -> list[np.ndarray]:
        """The blocks, let go of here: `finish` works once (a second call returns no rows)."""
        self._flush()
        blocks, self._blocks = self._blocks, []
        return blocks


class FloatRows(_Blocks):
    """Fixed-width rows of optional numbers → one 2-D float64 array (NaN where absent or not a number)."""

    def __init__(self, width: int, integers: bool = False) -> None:
        super().__init__()
        self.width = width
        self.integers = integers

    def _convert(self, values: list) -> np.ndarray:
        return _float_block(values, self.width, self.integers)

    def finish(self) -> np.ndarray:
        """One array, each block let go of as soon as it is copied in: a million spans' readings are never
        held twice (np.concatenate would hold every block until the whole array is made)."""
        blocks = self.take_blocks()
        rows = np.empty((sum(len(block) for block in blocks), self.width), dtype=np.float64)
        first = 0
        blocks.reverse()  # taken from the end, each block let go of as soon as it is copied in
        while blocks:
            block = blocks.pop()
            rows[first : first + len(block)] = block
            first += len(block)
        return rows

    def absorb(self, other: FloatRows) -> None:
        self._flush()
        other._flush()
        self._blocks.extend(other._blocks)


class IntColumn(_Blocks):
    """Optional integers → one int64 column (MISSING_TIME where absent or not an integer)."""

    def _convert(self, values: list) -> np.ndarray:
        return int_block(values)

    def finish(self) -> np.ndarray:
        blocks = self.take_blocks()
        return np.concatenate(blocks) if blocks else np.empty(0, dtype=np.int64)

    def absorb(self, other: IntColumn, offset: int = 0) -> None:
        self._flush()
        other._flush()
        self._blocks.extend(block + offset for block in other._blocks)


def int_block(values: list) -> np.ndarray:
    """Integers as int64; anything else becomes MISSING_TIME."""
    try:
        block = np.array(values, dtype=np.int64)
        if block.ndim != 1:
            raise ValueError("not a flat list of integers")
        return block
    except (TypeError, ValueError, OverflowError):
        return np.array([to_int(v) for v in values], dtype=np.int64)


def string_array(values: tuple | list) -> pa.Array:
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowException, TypeError, ValueError):
        return pa.array([_to_str(v) for v in values], type=pa.string())


class ProcessRuns:
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

    def absorb(self, other: ProcessRuns, process_map: dict[int, int]) -> None:
        for value, length in zip(other._values, other._lengths, strict=True):
            self.extend(process_map[value], length)
