"""The spans' input features (column_keys.FEATURE_KEYS), each key kept only where a span has a value.

Most keys are on one span of a request (its request span: tokens, pixels, the readings where its prompt
processing ended and where it answered); as full columns of a million spans they were 27 columns of
8 MB, nearly all NaN, and the largest part of the report's peak (docs/performance.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SpanFeatures:
    """key → (span rows with a value for it, ascending; the values)."""

    columns: dict[str, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def from_blocks(cls, keys: tuple[str, ...], blocks: list[tuple[np.ndarray, np.ndarray]]) -> SpanFeatures:
        """From (span rows, values: rows × keys) blocks in row order; `blocks` is emptied, each block let go
        of once it is split."""
        parts: dict[str, tuple[list, list]] = {key: ([], []) for key in keys}
        blocks.reverse()  # taken from the end, each block let go of as soon as it is split
        while blocks:
            rows, values = blocks.pop()
            for position, key in enumerate(keys):
                column = values[:, position]
                present = ~np.isnan(column)
                if present.any():
                    parts[key][0].append(rows[present])
                    parts[key][1].append(column[present])
        columns = {}
        for key, (row_parts, value_parts) in parts.items():
            if row_parts:
                rows, values = np.concatenate(row_parts), np.concatenate(value_parts)
                if len(rows) > 1 and (np.diff(rows) < 0).any():
                    order = np.argsort(rows, kind="stable")
                    rows, values = rows[order], values[order]
                columns[key] = (rows, values)
        return cls(columns)

    def rows(self, key: str) -> np.ndarray:
        """The spans (rows) that have a value for `key`."""
        return self.columns[key][0] if key in self.columns else np.zeros(0, np.int64)

    def at(self, key: str, rows: np.ndarray) -> np.ndarray:
        """`key`'s value at each of `rows` (NaN where that span has none)."""
        out = np.full(len(rows), np.nan)
        if key not in self.columns or not len(rows):
            return out
        have, values = self.columns[key]
        position = np.minimum(np.searchsorted(have, rows), len(have) - 1)
        found = have[position] == rows
        out[found] = values[position[found]]
        return out

    def dense(self, key: str, count: int) -> np.ndarray:
        """`key` as a full column of `count` spans, NaN where a span has none."""
        out = np.full(count, np.nan)
        if key in self.columns:
            rows, values = self.columns[key]
            out[rows] = values
        return out

    def kept(self, keep: np.ndarray) -> SpanFeatures:
        """The features of the spans where `keep` (one flag per span) holds, renumbered as those spans are
        once the others are dropped."""
        new_row = np.cumsum(keep) - 1
        columns = {}
        for key, (rows, values) in self.columns.items():
            stays = keep[rows]
            if stays.any():
                columns[key] = (new_row[rows[stays]], values[stays])
        return SpanFeatures(columns)
