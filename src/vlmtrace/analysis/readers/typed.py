"""The types the analysis relies on, checked where a reader takes a value: a span's ids and name are
text, its times integers; of its attributes, the stage and thread are text, memory readings and input
features numbers, per-device readings lists. A record whose own fields have the wrong type is skipped;
an attribute of the wrong type is read as absent; both are counted on the input's budget and reported
once per input with the first example (budget.py).
"""

from __future__ import annotations

import math
from typing import Any

from vlmtrace import semconv as sc
from vlmtrace.analysis.readers import budget
from vlmtrace.analysis.readers.depth import within_depth
from vlmtrace.analysis.step1_loading.column_keys import (
    FEATURE_KEYS,
    SAMPLE_JSON_KEYS,
    SAMPLE_NUMERIC_KEYS,
    SPAN_MEMORY_KEYS,
)

# The type each attribute the analysis reads must have (float: an int or a finite float; list: of numbers).
KINDS: dict[str, type] = {
    **dict.fromkeys((*SPAN_MEMORY_KEYS, *FEATURE_KEYS, *SAMPLE_NUMERIC_KEYS), float),
    **dict.fromkeys({sc.MEM_DEVICES} | {key + sc.PER_DEVICE_SUFFIX for key in sc.MEM_PER_DEVICE_KEYS}, list),
    **SAMPLE_JSON_KEYS,
    sc.STAGE: str,
    sc.THREAD_NAME: str,
}


def type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def is_number(value: Any) -> bool:
    kind = type(value)
    return kind is int or (kind is float and math.isfinite(value))


def text_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def wrong_head(trace_id: Any, span_id: Any, parent_id: Any, name: Any) -> str | None:
    """The first of a span's own fields whose type is wrong, with what it is; None when all are right."""
    for field, value, optional in (
        ("trace_id", trace_id, False),
        ("span_id", span_id, False),
        ("parent_id", parent_id, True),
        ("name", name, True),
    ):
        if type(value) is not str and not (optional and value is None):
            return f"{field!r} is {type_name(value)}"
    return None


def checked_attributes(attributes: dict) -> dict:
    """`attributes` with those the analysis reads kept only where their type is right (the others are
    counted on the current input's budget), and the objects and lists among them (a heap reading) cut at
    the depth bound. One pass, one dict lookup per attribute: the line reader calls it for every record."""
    wrong = None
    nested = None
    for key, value in attributes.items():
        kind = KINDS.get(key)
        if kind is None or value is None:
            continue
        given = type(value)
        if kind is float:
            if given is int or (given is float and value - value == 0):  # NaN and infinities are not numbers here
                continue
        elif kind is str:
            if given is str:
                continue
        elif kind is list:
            if given is list and all(is_number(item) for item in value):
                continue
        elif isinstance(value, kind):
            nested = [*(nested or ()), key]
            continue
        wrong = [*(wrong or ()), key]
    if nested is not None:
        attributes = _cut_nested(attributes, nested)
    if wrong is None:
        return attributes
    spending = budget.current()
    for key in wrong:
        spending.absent_field(f"attribute {key!r} is {type_name(attributes[key])}")
    return {key: value for key, value in attributes.items() if key not in wrong}


def cut_deep(value: Any, where: str) -> Any:
    """`value` cut at the depth bound, the cuts counted on the current input's budget."""
    value, cut = within_depth(value)
    if cut:
        budget.current().cut_deep(where, cut)
    return value


def _cut_nested(attributes: dict, keys: list[str]) -> dict:
    """`attributes` with the object or list values of `keys` cut at the depth bound."""
    kept = {key: cut_deep(attributes[key], f"attribute {key!r}") for key in keys}
    return {**attributes, **kept} if any(kept[key] is not attributes[key] for key in keys) else attributes
