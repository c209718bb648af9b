"""What the report and its JSON summary copy from an input, bounded: a journal of a million spans in
flight, or of stacks a megabyte wide, gives a summary of a few megabytes, never one as large as the
input. Each cut says how much it left out (a count beside the list, a suffix on the text). The bounds
are listed in docs/configuration.md ("What a report copies"); the journal itself is never cut.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson

IN_FLIGHT_LISTED = 1000  # spans in flight listed in the summary's `in_flight`, oldest first
ATTRIBUTES_LISTED = 64  # attributes of one span (and versions of one process), in the order they were recorded
VALUE_CHARS = 1024  # one attribute value, a span name; a list or map is cut as its JSON text
FATAL_REPORTS = 4  # faulthandler reports of one process, the first ones
FATAL_LINES = 200  # thread headers and frames of one report
LINE_CHARS = 500  # one line of a stack, a report's title
FATAL_TEXT_CHARS = 64 * 1024  # a report's text where no thread could be read from it
LINKED_REQUESTS = 20  # request names listed for one engine step
STAGES_LISTED = 100  # stages of one process and component, those that retained most first


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def _value(value: Any) -> tuple[Any, bool]:
    if isinstance(value, str):
        return cut(value, VALUE_CHARS), len(value) > VALUE_CHARS
    if isinstance(value, (list, tuple, dict)):
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
        return (value, False) if len(text) <= VALUE_CHARS else (cut(text, VALUE_CHARS), True)
    return value, False


def attributes(recorded: dict) -> tuple[dict, int]:
    """At most ATTRIBUTES_LISTED attributes, each value cut at VALUE_CHARS; and how many attributes were
    left out or cut."""
    kept: dict = {}
    shortened = 0
    for key, value in itertools.islice(recorded.items(), ATTRIBUTES_LISTED):
        kept[cut(str(key), VALUE_CHARS)], was_cut = _value(value)
        shortened += was_cut
    return kept, max(0, len(recorded) - ATTRIBUTES_LISTED) + shortened
