"""Open any input (gzip or not, found by its magic bytes), recognise its format by content, read it.

File names are not trusted: a Tempo response saved as `.txt` or a journal without its extension
is still recognised by what it holds. Inputs are untrusted too: a compressed file is read only up
to a bound (`ReadLimits`), so a small gzip bomb costs seconds, not the machine's memory.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import io
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable
from typing import IO

import orjson

from vlmtrace.analysis.readers import jaeger, tempo
from vlmtrace.analysis.readers.journal import JournalReader, looks_like_journal, rotation_order
from vlmtrace.analysis.readers.otlp_json import add_resource_spans
from vlmtrace.analysis.readers.parallel import read_parallel, worker_count
from vlmtrace.analysis.readers.torch_snapshot import MAX_SNAPSHOT_BLOCKS, PICKLE_MAGIC, add_snapshot
from vlmtrace.analysis.trace_data import InputInfo, TraceData

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
BUFFER_BYTES = 1 << 20
# Decompressed in small steps, so a cut-off gzip file loses only its last step.
GZIP_STEP_BYTES = 64 * 1024
DETECT_BYTES = 64 * 1024
FORMAT_JOURNAL = "vlmtrace journal"
FORMAT_JSON_LINES = "JSON lines"
FORMAT_JSON_DOCUMENT = "JSON document"
FORMAT_SNAPSHOT = "PyTorch memory snapshot"
# Files that are read and deliberately left out: no InputInfo, no error.
NOT_TRACES = "not traces"
NOT_A_FORMAT = "not a trace format this analyzer knows"
# Real journals compress 20-30 to 1; a bound well above that, with a floor for small files.
EXPANSION_RATIO = 64
EXPANDED_BYTES_FLOOR = 128 * 1024 * 1024
EXPANDED_BYTES_VARIABLE = "VLMTRACE_REPORT_MAX_EXPANDED_BYTES"

ProgressCallback = Callable[[int, int], None]


JOURNAL_HEADER_START = re.compile(rb'\{\s*"k"\s*:\s*"header"')
TRACE_NAME = re.compile(r"\.(jsonl?|pickle|pkl)(\.\d+)?(\.gz)?$|\.gz$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """How much one input may cost. A compressed file is read up to `expansion_ratio` times its size,
    at least `expanded_bytes_floor` (or exactly `expanded_bytes_fixed`, from EXPANDED_BYTES_VARIABLE);
    a snapshot's blocks are summarised up to `snapshot_blocks`."""

    expanded_bytes_floor: int = EXPANDED_BYTES_FLOOR
    expansion_ratio: int = EXPANSION_RATIO
    expanded_bytes_fixed: int | None = None
    snapshot_blocks: int = MAX_SNAPSHOT_BLOCKS

    @classmethod
    def from_environment(cls) -> ReadLimits:
        value = os.environ.get(EXPANDED_BYTES_VARIABLE, "")
        return cls(expanded_bytes_fixed=int(value)) if value.isdigit() else cls()

    def expanded_bytes(self, compressed_size: int) -> int:
        if self.expanded_bytes_fixed is not None:
            return self.expanded_bytes_fixed
        return max(self.expanded_bytes_floor, self.expansion_ratio * compressed_size)


class InputTooLarge(OSError):
    """A compressed input expands beyond its bound; what came before was read."""


class _Bounded(io.RawIOBase):
    """A decompressed stream that raises `InputTooLarge` instead of yielding more than `limit` bytes."""

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        self._inner, self._left, self._limit = inner, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        count = self._inner.readinto(buffer)  # type: ignore[attr-defined]
        self._left -= count
        if self._left < 0:
            raise InputTooLarge(
                f"decompressed, it is larger than {self._limit:,} bytes (the bound: {EXPANSION_RATIO} times the "
                f"compressed size, at least {EXPANDED_BYTES_FLOOR >> 20} MiB; {EXPANDED_BYTES_VARIABLE} sets another); "
                "reading stopped there"
            )
        return count

    def close(self) -> None:
        self._inner.close()
        super().close()


def display_name(path: str) -> str:
    """The path as text that can be written anywhere: undecodable bytes of a file name become U+FFFD."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def unreadable_reason(path: str) -> str | None:
    """Why `path` is not a regular file that can be read (None when it is one)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symbolic link loop"
        if error.errno == errno.ENOENT:
            return "broken symbolic link" if os.path.islink(path) else "no such file"
        return f"cannot be read: {error.strerror or error}"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file: copy what it delivers into a file and name that"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return "not a regular file"
    return None


def expand(paths: Iterable[str], data: TraceData | None = None) -> list[str]:
    """Files named directly, plus the trace files inside named directories (rotated journals in
    sequence; a report written into the journal's directory is not read back as input). With `data`,
    a directory that holds no trace files and a subdirectory that cannot be listed are problems."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = []

            def unlisted(error: OSError, top: str = path) -> None:
                if data is not None:
                    name = display_name(error.filename or top)
                    data.problem(name, None, f"directory cannot be listed ({error.strerror or error}); its files were not read")

            for root, dirs, names in os.walk(path, onerror=unlisted):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(os.path.join(root, name) for name in names if not name.startswith(".") and TRACE_NAME.search(name))
            if not found and data is not None:
                data.problem(display_name(path), None, "no trace files in this directory (journals are *.jsonl, exports *.json, *.gz)")
            files.extend(sorted(found, key=rotation_order))
        else:
            files.append(path)
    return files


def _open(path: str, limits: ReadLimits) -> tuple[IO[bytes], Callable[[], int], bool]:
    """A buffered byte stream of the file's content (decompressed, within `limits`), a callable
    giving bytes read on disk, and whether the file is compressed."""
    raw = open(path, "rb", buffering=BUFFER_BYTES)
    if raw.peek(2)[:2] == GZIP_MAGIC:
        bounded = _Bounded(gzip.GzipFile(fileobj=raw, mode="rb"), limits.expanded_bytes(os.fstat(raw.fileno()).st_size))  # type: ignore[arg-type]
        return io.BufferedReader(bounded, buffer_size=GZIP_STEP_BYTES), raw.tell, True
    return raw, raw.tell, False


def _kind_of(head: bytes) -> str:
    body = head.lstrip(b" \t\r\n")
    if not body:
        return "empty"
    if body[:15].lower() == b"<!doctype html>" and b"vlmtrace" in body:
        return NOT_TRACES
    if body[:1] == PICKLE_MAGIC:
        return FORMAT_SNAPSHOT
    if body[:1] not in (b"{", b"["):
        return "unknown"
    first_line, newline, _ = body.partition(b"\n")
    if not newline and JOURNAL_HEADER_START.match(body):
        return FORMAT_JOURNAL  # a header longer than the detection window (a long argv)
    if newline:
        try:
            first = orjson.loads(first_line)
        except orjson.JSONDecodeError:
            return FORMAT_JSON_DOCUMENT
        if looks_like_journal(first):
            return FORMAT_JOURNAL
        return FORMAT_JSON_LINES if isinstance(first, (dict, list)) else FORMAT_JSON_DOCUMENT
    return FORMAT_JSON_DOCUMENT


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
    if str(document.get("schema", "")).startswith("vlmtrace.summary/"):
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
        data.problem(source, line, f"the server answered with an error: {str(document['error'])[:200]}")
        return None
    keys = ", ".join(repr(str(key)[:30]) for key in list(document)[:5])
    data.problem(source, line, f"{NOT_A_FORMAT} (top-level keys: {keys})")
    return None


def add_payload(data: TraceData, payload: bytes, source: str) -> None:
    """Read bytes fetched from somewhere (a remote API) exactly as a file with that content."""
    if payload[:2] == GZIP_MAGIC:
        try:
            payload = gzip.decompress(payload)
        except (OSError, EOFError, zlib.error) as error:
            data.problem(source, None, f"compressed response cannot be read: {error}")
            return
    _read_stream(data, io.BufferedReader(io.BytesIO(payload)), source, lambda: 0, None, JournalReader(data))  # type: ignore[arg-type]


def _read_json_lines(data: TraceData, stream: IO[bytes], source: str) -> str | None:
    name = None
    for lineno, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            document = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            data.problem(source, lineno, f"not valid JSON ({error.msg}); line skipped")
            continue
        name = add_document(data, document, source, lineno) or name
        if name == NOT_TRACES:
            break
    return name


def _read_json_document(data: TraceData, stream: IO[bytes], source: str) -> str | None:
    text = stream.read()
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        first_line = text.lstrip().split(b"\n", 1)[0]
        if first_line.strip() != text.strip() and _parses(first_line):
            return _read_json_lines(data, io.BytesIO(text), source)  # JSON lines longer than the detection window
        data.problem(source, error.lineno, f"not valid JSON at column {error.colno} ({error.msg}); nothing read from it")
        return None
    return add_document(data, document, source, 1)


def _parses(text: bytes) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _read_stream(
    data: TraceData,
    stream: IO[bytes],
    source: str,
    position: Callable[[], int],
    progress: Callable[[int], None] | None,
    journal: JournalReader,
    workers: int = 1,
    limits: ReadLimits = ReadLimits(),
) -> None:
    spans_before, samples_before = data.spans.count, data.samples.count
    if stream.peek(len(UTF8_BOM))[: len(UTF8_BOM)] == UTF8_BOM:  # type: ignore[attr-defined]
        stream.read(len(UTF8_BOM))  # an editor's byte-order mark; the parallel reader would read it as a record
        workers = 1
    kind = _kind_of(stream.peek(DETECT_BYTES)[:DETECT_BYTES])  # type: ignore[attr-defined]
    name: str | None = kind
    if kind == FORMAT_JOURNAL and workers > 1:
        read_parallel(data, journal, source, workers, progress)
    elif kind == FORMAT_JOURNAL:
        journal.read_file(source, stream, position, progress)
    elif kind == FORMAT_JSON_LINES:
        name = _read_json_lines(data, stream, source)
    elif kind == FORMAT_JSON_DOCUMENT:
        name = _read_json_document(data, stream, source)
    elif kind == FORMAT_SNAPSHOT:
        add_snapshot(data, stream, source, limits.snapshot_blocks)
    elif kind == NOT_TRACES:
        data.problem(source, None, "a vlmtrace report (its own output), not traces; skipped", "note")
    elif kind == "empty":
        data.problem(source, None, "empty file")
    else:
        data.problem(
            source, 1, f"{NOT_A_FORMAT} (expected JSON, JSON lines, a journal or a snapshot)"
        )
    if name and name not in ("empty", "unknown", NOT_TRACES):
        data.inputs.append(
            InputInfo(source, name, data.spans.count - spans_before, data.samples.count - samples_before)
        )


def _quiet_if_not_traces(data: TraceData, source: str, problems_before: int) -> None:
    """A file found in a directory that holds no trace format at all (a server log, a config): one
    note, not a list of errors; a file named on the command line stays an error."""
    found = data.problems[problems_before:]
    if found and all(problem.reason.startswith((NOT_A_FORMAT, "more than")) for problem in found):
        del data.problems[problems_before:]
        data.problem(source, None, f"{NOT_A_FORMAT}; skipped (found in a directory)", "note")


def read_inputs(
    paths: Iterable[str],
    progress: ProgressCallback | None = None,
    data: TraceData | None = None,
    limits: ReadLimits | None = None,
) -> TraceData:
    """Read every file (directories expanded); bad input is listed in `problems`, never raised."""
    data = data if data is not None else TraceData()
    limits = limits if limits is not None else ReadLimits.from_environment()
    paths = list(paths)
    named = {path for path in paths if not os.path.isdir(path)}
    files = expand(paths, data)
    sizes = {path: os.path.getsize(path) if os.path.isfile(path) else 0 for path in files}
    total = sum(sizes.values())
    done = 0
    journal = JournalReader(data)
    for path in files:
        source = display_name(path)
        reason = unreadable_reason(path)
        if reason is not None:
            data.problem(source, None, reason)
            continue
        try:
            stream, position, compressed = _open(path, limits)
        except OSError as error:
            data.problem(source, None, f"cannot be opened: {error.strerror or error}")
            continue
        report = None
        if progress is not None:
            base = done

            def report(position_in_file: int, base: int = base) -> None:
                progress(base + position_in_file, total)

        # Workers reopen the file by its name, so a name that is not valid text is read in one process.
        workers = 1 if compressed or source != path else worker_count(sizes[path])
        problems_before, inputs_before = len(data.problems), len(data.inputs)
        with stream:
            try:
                _read_stream(data, stream, source, position, report, journal, workers, limits)
            except InputTooLarge as error:
                data.problem(source, None, str(error))
            except (EOFError, OSError, zlib.error) as error:
                data.problem(source, None, f"file cannot be read to its end ({error}); what came before was kept")
        if path not in named and len(data.inputs) == inputs_before:
            _quiet_if_not_traces(data, source, problems_before)
        done += sizes[path]
        if progress is not None:
            progress(done, total)
    journal.finish()
    return data
