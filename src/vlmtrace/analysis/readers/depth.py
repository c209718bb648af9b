"""The depth of every value kept from input, bounded.

JSON parsers accept objects and lists nested a thousand levels deep (orjson: 1024), but the steps after
reading do not: a worker's result is pickled to the main process, the summary is written by orjson
(255 levels), and `str()` of such a value recurses once per level. So a value a reader keeps (a header's
resource, argv and versions, an in-flight span's attributes and links, a heap reading carried by a
sample) is copied with whatever lies deeper than MAX_DEPTH levels replaced by CUT, and the cuts are
counted; a value shown as text (a warning's message, an unknown record kind) goes through `text`.
"""

from __future__ import annotations

from typing import Any

import orjson

# Levels of objects and lists kept of one value (OpenTelemetry attributes are flat; a list of objects,
# the deepest a vlmtrace record holds, is two).
MAX_DEPTH = 8
CUT = f"(nested deeper than {MAX_DEPTH} levels: cut)"
_CONTAINERS = (dict, list, tuple)


def within_depth(value: Any, levels: int = MAX_DEPTH) -> tuple[Any, int]:
    """`value` with every object or list below `levels` levels replaced by CUT, and how many were cut.
    A value of no more levels is returned as it is (not copied)."""
    if type(value) not in _CONTAINERS:
        return value, 0
    cut = _count_deeper(value, levels)
    return (_cut(value, levels), cut) if cut else (value, 0)


def _count_deeper(value: Any, levels: int) -> int:
    """How many objects or lists sit right below `levels` levels (recursion stops there)."""
    items = value.values() if type(value) is dict else value
    if levels <= 0:
        return 1
    return sum(_count_deeper(item, levels - 1) for item in items if type(item) in _CONTAINERS)


def _cut(value: Any, levels: int) -> Any:
    if type(value) not in _CONTAINERS:
        return value
    if levels <= 0:
        return CUT
    if type(value) is dict:
        return {key: _cut(item, levels - 1) for key, item in value.items()}
    return [_cut(item, levels - 1) for item in value]


def text(value: Any, chars: int) -> str:
    """Any value read from input as at most `chars` characters of text: a string as it is, anything
    else as JSON (cut at MAX_DEPTH levels), never recursing deeper."""
    if type(value) is str:
        return value[:chars]
    shown, _ = within_depth(value)
    try:
        return orjson.dumps(shown, option=orjson.OPT_NON_STR_KEYS)[: chars * 4].decode("utf-8", "ignore")[:chars]
    except (orjson.JSONEncodeError, TypeError):
        return f"({type(value).__name__})"
