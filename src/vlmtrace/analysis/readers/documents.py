"""JSON documents of any trace format this analyzer knows, recognised by their keys and read into a
`TraceData`: OTLP JSON, Jaeger's API v1 and v3, Tempo's trace-by-id v1 and v2, each as one document or as
JSON lines (one document a line)."""

from __future__ import annotations

import io
import re
from typing import IO

import orjson

from vlmtrace.analysis.readers import budget, jaeger, tempo
from vlmtrace.analysis.readers.depth import text
from vlmtrace.analysis.readers.otlp_json import add_resource_spans
from vlmtrace.analysis.readers.strays import Strays, StraysOnly
from vlmtrace.analysis.trace_data import Problem, TraceData

# Files that are read and deliberately left out: no InputInfo, no error.
NOT_TRACES = "not traces"
NOT_A_FORMAT = "not a trace format this analyzer knows"

_NOT_BLANK = re.compile(rb"\S")


def add_document(data: TraceData, document: object, source: str, line: int) -> str | None:
    """Read one parsed JSON document of any supported trace format; returns the format's name."""
    if isinstance(document, list):
        # A list of documents, one level deep: deeper nesting is no format's and would recurse without bound.
        if not all(isinstance(item, dict) for item in document):
            data.problem(source, line, "not a trace document (expected a list of JSON objects)")
        names = [add_document(data, item, source, line) for item in document if isinstance(item, dict)]
        return next((name for name in names if name), None)
    if not isinstance(document, dict):
        data.problem(source, line, "not a trace document (expected a JSON object)")
        return None
    schema = document.get("schema")
    if isinstance(schema, str) and schema.startswith("vlmtrace.summary/"):
        data.problem(source, None, "a vlmtrace report summary (its own output), not traces; skipped", "note")
        return NOT_TRACES
    if "resourceMetrics" in document or "resourceLogs" in document:
        data.problem(source, None, "OpenTelemetry metrics or logs, not traces; skipped", "note")
        return NOT_TRACES
    if "resourceSpans" in document:
        add_resource_spans(data, document["resourceSpans"], source, line, "resourceSpans")
        return "OTLP JSON"
    if "batches" in document:
        tempo.add_v1_response(data, document, source, line)
        return "Tempo trace-by-id v1"
    if "trace" in document:
        tempo.add_v2_response(data, document, source, line)
        return "Tempo trace-by-id v2"
    if "result" in document:
        jaeger.add_v3_response(data, document, source, line)
        return "Jaeger API v3"
    if "data" in document:
        jaeger.add_v1_response(data, document, source, line)
        return "Jaeger API v1"
    if "spans" in document and "traceID" in document:
        jaeger.add_v1_trace(data, document, source, line, "trace")
        return "Jaeger API v1"
    if "traces" in document:
        data.problem(source, line, "a Tempo search result lists trace ids only; pull the traces with --tempo URL")
        return None
    if "error" in document:
        data.problem(source, line, f"the server answered with an error: {text(document['error'], 200)}")
        return None
    keys = ", ".join(repr(str(key)[:30]) for key in list(document)[:5])
    data.problem(source, line, f"{NOT_A_FORMAT} (top-level keys: {keys})")
    return None


def read_json_lines(data: TraceData, stream: IO[bytes], source: str) -> str | None:
    """One document a line; a file of lines nearly all of no format (strays.py) is not read on."""
    name = None
    strays = Strays(data, source, "lines of no trace format")
    for lineno, line in enumerate(budget.current().lines(stream), start=1):
        if not line.strip():
            continue
        try:
            document = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            data.problem(source, lineno, f"not valid JSON ({error.msg}); line skipped")
            found = None
        else:
            found = add_document(data, document, source, lineno)
        if found is None:
            try:
                strays.add(lineno)
            except StraysOnly as stop:
                data.problems.append(Problem(source, None, f"{NOT_A_FORMAT}: {stop}"))
                break
            continue
        name = found
        if name == NOT_TRACES:
            break
    return name


def read_json_document(data: TraceData, stream: IO[bytes], source: str) -> str | None:
    spending = budget.current()
    text = stream.read(spending.limits.record_bytes + 1)
    complete = len(text) <= spending.limits.record_bytes
    first = _NOT_BLANK.search(text)
    newline = text.find(b"\n", first.start()) if first else -1
    if (
        first is not None
        and newline >= 0
        and _NOT_BLANK.search(text, newline)
        and _parses(text[first.start() : newline])
    ):
        # JSON lines whose first line is longer than the detection window: read on as lines
        return read_json_lines(data, io.BufferedReader(_Prefixed(text, stream)), source)
    spending.bytes_read += len(text)
    if not complete:
        data.problem(
            source,
            None,
            f"a JSON document larger than the record bound of {spending.limits.record_bytes:,} bytes; "
            "nothing read from it (--max record-bytes=… raises it)",
        )
        return None
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        data.problem(
            source, error.lineno, f"not valid JSON at column {error.colno} ({error.msg}); nothing read from it"
        )
        return None
    del text
    return add_document(data, document, source, 1)


class _Prefixed(io.RawIOBase):
    """Bytes already read from a stream, then the rest of that stream."""

    def __init__(self, prefix: bytes, stream: IO[bytes]) -> None:
        self._prefix, self._offset, self._stream = memoryview(prefix), 0, stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        if self._offset < len(self._prefix):
            count = min(len(buffer), len(self._prefix) - self._offset)
            buffer[:count] = self._prefix[self._offset : self._offset + count]
            self._offset += count
            return count
        return self._stream.readinto(buffer)  # type: ignore[attr-defined]


def _parses(text: bytes) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True
