"""Recognise each input's format by content, and read it.

File names are not trusted: a Tempo response saved as `.txt` or a journal without its extension
is still recognised by what it holds. Which files are read, and how much of each, is `files`; the JSON
formats are read by `documents`, journals by `journal` (or `journal_columns`).
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import re
import zlib
from collections.abc import Callable, Iterable

import orjson

from vlmtrace.analysis.readers import budget, parallel
from vlmtrace.analysis.readers.budget import Budget, InputTooLarge, ReadLimits
from vlmtrace.analysis.readers.documents import NOT_A_FORMAT, NOT_TRACES, read_json_document, read_json_lines
from vlmtrace.analysis.readers.files import GZIP_MAGIC, Bounded, display_name, expand, open_input, unreadable_reason
from vlmtrace.analysis.readers.journal import JournalReader, looks_like_journal
from vlmtrace.analysis.readers.journal_columns import read_columns
from vlmtrace.analysis.readers.process_bound import ProcessBound
from vlmtrace.analysis.readers.torch_snapshot import PICKLE_MAGIC, add_snapshot
from vlmtrace.analysis.step1_loading.columns import MAX_DEVICES
from vlmtrace.analysis.trace_data import InputInfo, Problem, TraceData

UTF8_BOM = b"\xef\xbb\xbf"
DETECT_BYTES = 64 * 1024
DETECT_LINES = 8  # lines after a first line that is not JSON looked at for journal records
FORMAT_JOURNAL = "vlmtrace journal"
FORMAT_JSON_LINES = "JSON lines"
FORMAT_JSON_DOCUMENT = "JSON document"
FORMAT_SNAPSHOT = "PyTorch memory snapshot"
ProgressCallback = Callable[[int, int], None]
# Listings of a directory while a live journal's writer rotates files away under the reading.
RELISTINGS = 3


JOURNAL_HEADER_START = re.compile(rb'\{\s*"k"\s*:\s*"header"')


def _kind_of(head: bytes) -> str:
    body = head.lstrip(b" \t\r\n")
    if not body:
        return "empty"
    if body[:15].lower() == b"<!doctype html>" and b"vlmtrace" in body:
        return NOT_TRACES
    if body[:1] == PICKLE_MAGIC:
        return FORMAT_SNAPSHOT
    if body[:1] not in (b"{", b"["):
        return FORMAT_JOURNAL if _journal_after_bad_line(body) else "unknown"
    first_line, newline, _ = body.partition(b"\n")
    if not newline and JOURNAL_HEADER_START.match(body):
        return FORMAT_JOURNAL  # a header longer than the detection window (a long argv)
    if newline:
        try:
            first = orjson.loads(first_line)
        except orjson.JSONDecodeError:
            return FORMAT_JOURNAL if _journal_after_bad_line(body) else FORMAT_JSON_DOCUMENT
        if looks_like_journal(first) or (not isinstance(first, dict) and _journal_after_bad_line(body)):
            return FORMAT_JOURNAL
        return FORMAT_JSON_LINES if isinstance(first, (dict, list)) else FORMAT_JSON_DOCUMENT
    return FORMAT_JSON_DOCUMENT


def _journal_after_bad_line(body: bytes) -> bool:
    """Whether the complete lines after a first line that is not a JSON object are journal records (a
    header torn or overwritten): the journal is read on, the bad line named."""
    lines = body.split(b"\n")[1:-1][:DETECT_LINES]
    records = []
    for line in lines:
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return bool(records) and all(looks_like_journal(record) for record in records)


def add_payload(data: TraceData, payload: bytes, source: str) -> None:
    """Read bytes fetched from somewhere (a remote API) exactly as a file with that content."""
    if payload[:2] == GZIP_MAGIC:
        try:
            payload = gzip.decompress(payload)
        except (OSError, EOFError, zlib.error) as error:
            data.problem(source, None, f"compressed response cannot be read: {error}")
            return
    spending = Budget(ReadLimits.from_environment(), data)
    token = budget.reading(spending)
    try:
        _read_stream(data, io.BufferedReader(io.BytesIO(payload)), source, lambda: 0, None, JournalReader(data))
    except InputTooLarge as error:
        _stopped(data, source, str(error))
    finally:
        budget.done(token)
    for reason in spending.reasons():
        _stopped(data, source, reason)


def _read_stream(
    data: TraceData,
    stream: io.BufferedReader,
    source: str,
    position: Callable[[], int],
    progress: Callable[[int], None] | None,
    journal: JournalReader,
    plain_path: str | None = None,
    size: int = 0,
) -> None:
    """Read one input of any format; `plain_path`: the file's path when its bytes are the stream's
    (not compressed), so that a journal of `size` bytes can be read in columns."""
    spans_before, samples_before, empty_before, cut_before = (
        data.spans.count,
        data.samples.count,
        data.samples.empty,
        data.devices.devices_cut,
    )
    if stream.peek(len(UTF8_BOM))[: len(UTF8_BOM)] == UTF8_BOM:
        stream.read(len(UTF8_BOM))  # an editor's byte-order mark
        plain_path = None
    kind = _kind_of(stream.peek(DETECT_BYTES)[:DETECT_BYTES])
    name: str | None = kind
    stopped = None
    try:
        if kind == FORMAT_JOURNAL:
            if plain_path is None or not read_columns(
                journal, source, plain_path, budget.current().limits, stream, size
            ):
                journal.read_file(source, stream, position, progress)
        elif kind == FORMAT_JSON_LINES:
            name = read_json_lines(data, stream, source)
        elif kind == FORMAT_JSON_DOCUMENT:
            name = read_json_document(data, stream, source)
        elif kind == FORMAT_SNAPSHOT:
            limit = budget.current().limits.input_bytes
            reason = f"larger than the input bound of {limit:,} bytes (--max input-bytes=… raises it); not read"
            add_snapshot(data, io.BufferedReader(Bounded(stream, limit, reason)), source)
        elif kind == NOT_TRACES:
            data.problem(source, None, "a vlmtrace report (its own output), not traces; skipped", "note")
        elif kind == "empty":
            data.problem(source, None, "empty file")
        else:
            data.problem(source, 1, f"{NOT_A_FORMAT} (expected JSON, JSON lines, a journal or a snapshot)")
    except InputTooLarge as error:  # a bound stopped it: what was read is this input's
        stopped = error
    if name and name not in ("empty", "unknown", NOT_TRACES):
        data.inputs.append(
            InputInfo(source, name, data.spans.count - spans_before, data.samples.count - samples_before)
        )
    empty = data.samples.empty - empty_before
    if empty:
        data.problem(
            source,
            None,
            f"{empty:,} sample record{'s' if empty != 1 else ''} without a memory reading; not kept",
            "note",
        )
    cut = data.devices.devices_cut - cut_before
    if cut:
        data.problem(
            source, None, f"{cut:,} per-device readings past the first {MAX_DEVICES} devices of a reading; not kept"
        )
    if stopped is not None:
        raise stopped


def _stopped(data: TraceData, source: str, reason: str) -> None:
    """A bound reached or what was skipped under it: always listed (never folded into "more than N
    problems"), so the report says which bound to raise."""
    data.problems.append(Problem(source, None, reason))


def _quiet_if_not_traces(data: TraceData, source: str, problems_before: int) -> None:
    """A file found in a directory that holds no trace format at all (a server log, a config): one
    note, not a list of errors; a file named on the command line stays an error."""
    found = data.problems[problems_before:]
    if found and all(problem.reason.startswith((NOT_A_FORMAT, "empty file", "more than")) for problem in found):
        del data.problems[problems_before:]
        what = "empty file" if found[0].reason == "empty file" else NOT_A_FORMAT  # a journal opened, never written
        data.problem(source, None, f"{what}; skipped (found in a directory)", "note")


def _unreadable(data: TraceData, source: str, named: bool, reason: str) -> None:
    """A file that cannot be read; one found in a directory and gone since it was listed is a note: a
    live journal's writer deletes its oldest file as it rotates (`max_files`)."""
    if reason == "no such file" and not named:
        data.problem(
            source,
            None,
            "deleted since its directory was listed (a journal's writer rotating its oldest file away); not read",
            "note",
        )
    else:
        data.problem(source, None, reason)


def _read_file(
    data: TraceData,
    journal: JournalReader,
    path: str,
    named: bool,
    limits: ReadLimits,
    progress: Callable[[int], None] | None,
    columnar: bool,
) -> None:
    """Read one file of any format into `data`; `named`: given on the command line, not found in a
    directory; `columnar`: a plain journal may be read by DuckDB (in a forked worker only)."""
    source = display_name(path)
    reason = unreadable_reason(path)
    if reason is not None:
        _unreadable(data, source, named, reason)
        return
    try:
        stream, position, compressed, size = open_input(path, limits)
    except OSError as error:
        _unreadable(
            data,
            source,
            named,
            "no such file" if error.errno == errno.ENOENT else f"cannot be opened: {error.strerror or error}",
        )
        return
    problems_before, inputs_before = len(data.problems), len(data.inputs)
    spending = Budget(limits, data)
    token = budget.reading(spending)
    with stream:
        try:
            _read_stream(
                data, stream, source, position, progress, journal, path if columnar and not compressed else None, size
            )
        except InputTooLarge as error:
            _stopped(data, source, str(error))
        except (EOFError, OSError, zlib.error) as error:
            data.problem(source, None, f"file cannot be read to its end ({error}); what came before was kept")
        finally:
            budget.done(token)
    for reason in spending.reasons():
        _stopped(data, source, reason)
    if not named and len(data.inputs) == inputs_before:
        _quiet_if_not_traces(data, source, problems_before)


def _read_files(
    data: TraceData,
    journal: JournalReader,
    files: list[str],
    read_file: parallel.ReadFile,
    progress: ProgressCallback | None,
    bound: ProcessBound,
) -> None:
    files = bound.admitted(data, files)
    sizes = [_size(path) for path in files]
    if files and parallel.worker_count(len(files)):
        parallel.read_files(data, journal, files, sizes, read_file, progress, bound)
        return
    total, done = sum(sizes), 0
    for path, size in zip(files, sizes, strict=True):
        report = None
        if progress is not None:

            def report(position_in_file: int, base: int = done) -> None:
                progress(base + position_in_file, total)

        part, pending = parallel.read_one(path, read_file, report, False)
        parallel.merge(data, journal, part, pending, path, bound)
        done += size
        if progress is not None:
            progress(done, total)


def _size(path: str) -> int:
    """A file's size for the progress bar: 0 for what is not a file, or is gone."""
    try:
        return os.stat(path).st_size if os.path.isfile(path) else 0
    except OSError:
        return 0


def read_inputs(
    paths: Iterable[str | os.PathLike[str]],
    progress: ProgressCallback | None = None,
    data: TraceData | None = None,
    limits: ReadLimits | None = None,
) -> TraceData:
    """Read every file (directories expanded), a file per forked process; bad input is listed in
    `problems`, never raised."""
    data = data if data is not None else TraceData()
    read_limits = limits if limits is not None else ReadLimits.from_environment()
    names = [os.fspath(path) for path in paths]
    named = {name for name in names if not os.path.isdir(name)}
    directories = [name for name in names if name not in named]
    files = expand(names, data)
    journal = JournalReader(data)

    def read_file(
        part: TraceData, reader: JournalReader, path: str, report: Callable[[int], None] | None, columnar: bool
    ) -> None:
        _read_file(part, reader, path, path in named, read_limits, report, columnar)

    read: set[str] = set()
    bound = ProcessBound(read_limits.processes)
    for _ in range(RELISTINGS + 1):
        _read_files(data, journal, files, read_file, progress, bound)
        read.update(files)
        # A live journal's writer rotated files away while they were read: the files it went on in are read too.
        if not directories or all(os.path.lexists(path) for path in files):
            break
        files = [path for path in expand(directories) if path not in read]
        if not files:
            break
    bound.report(data)
    journal.finish()
    return data
