"""Bytes and durations in the words people use (MiB, ms), shared by the summary texts and the report."""

from __future__ import annotations

import math

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    sign = "+" if signed and value > 0 else ("−" if value < 0 else "")
    size = abs(value)
    unit = 0
    while size >= 1024 and unit < len(_BYTE_UNITS) - 1:
        size /= 1024
        unit += 1
    digits = 0 if unit == 0 else (1 if size >= 10 else 2)
    return f"{sign}{size:.{digits}f} {_BYTE_UNITS[unit]}"


def format_seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    if value < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} days"


def format_count(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if value >= 1e6:
        return f"{value / 1e6:.1f} M"
    if value >= 1e4:
        return f"{value / 1e3:.0f} k"
    return f"{value:,.0f}"
