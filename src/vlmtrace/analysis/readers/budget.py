"""What one input may cost, enforced where the work happens.

Each input (a file, or a response pulled from Jaeger or Tempo) is read under a `Budget` made from
`ReadLimits`: bytes read, the size of one record (a line, or a whole JSON document), records, spans,
processes, snapshot blocks and frame file-name bytes, and CPU seconds. The readers tick it in their
inner loops; when a bound is reached reading stops with `BudgetReached`, the input's reader keeps what
came before, and the report says which bound stopped it and how to raise it (`--max NAME=VALUE`).
A line longer than the record bound is skipped and counted, never held whole; a sparse file's holes
are stepped over, not read.
"""

from __future__ import annotations

import contextvars
import dataclasses
import errno
import io
import os
import re
import time
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from vlmtrace.analysis.readers.depth import MAX_DEPTH

if TYPE_CHECKING:
    from vlmtrace.analysis.trace_data import TraceData

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MAX_SNAPSHOT_BLOCKS = 2_000_000
# Real journals compress 20-30 to 1; a bound well above that, with a floor for small files.
EXPANSION_RATIO = 64
EXPANDED_BYTES_FLOOR = 128 * MiB
EXPANDED_BYTES_VARIABLE = "VLMTRACE_REPORT_MAX_EXPANDED_BYTES"
SKIP_STEP_BYTES = 1 * MiB
CHECK_EVERY = 1024  # ticks between looks at the clock and the tables' sizes
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE | re.ASCII)
MAX_AMOUNT = 1 << 50  # 1024T: above any bound one input could reach


class InputTooLarge(OSError):
    """An input reached one of its bounds; what came before was read."""


class BudgetReached(InputTooLarge):
    """A bound of `ReadLimits` was reached while reading one input."""


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """How much one input may cost. Each field is a `--max` name (underscores as dashes). A compressed
    file is read up to `expansion_ratio` times its size, at least `expanded_bytes_floor` (or exactly
    `expanded_bytes_fixed`, from EXPANDED_BYTES_VARIABLE or `--max expanded-bytes=`)."""

    input_bytes: int = 8 * GiB  # bytes of content read from one input (after decompression)
    record_bytes: int = 64 * MiB  # one line, or one JSON document read whole
    records: int = 50_000_000  # lines of one input
    spans: int = 10_000_000  # spans read from one input
    samples: int = 1_000_000  # memory samples kept from one input (~140 bytes each; a day at 10 a second: 864,000)
    # processes (journal headers, OTLP resources, Jaeger processes) of one input, and of all inputs together:
    # the crash analysis of each process that did not end cleanly costs ~10 ms
    processes: int = 256
    snapshot_blocks: int = MAX_SNAPSHOT_BLOCKS  # memory blocks summarised from one snapshot
    snapshot_frame_bytes: int = 256 * MiB  # frame file-name bytes looked at to name allocation sites
    snapshot_bytes: int = 512 * MiB  # memory a snapshot's objects may take once decoded (plain_pickle.py)
    cpu_seconds: float = 300.0  # CPU time spent reading one input
    expanded_bytes_floor: int = EXPANDED_BYTES_FLOOR
    expansion_ratio: int = EXPANSION_RATIO
    expanded_bytes_fixed: int | None = None

    @classmethod
    def from_environment(cls, settings: list[str] | None = None) -> ReadLimits:
        """The defaults, EXPANDED_BYTES_VARIABLE, then `NAME=VALUE` settings (ValueError if one is wrong)."""
        value = os.environ.get(EXPANDED_BYTES_VARIABLE, "").strip()
        try:
            limits = cls(expanded_bytes_fixed=int(parse_amount(value))) if value else cls()
        except ValueError as error:
            raise ValueError(f"{EXPANDED_BYTES_VARIABLE}: {error}") from None
        return limits.with_settings(settings or [])

    def with_settings(self, settings: list[str]) -> ReadLimits:
        names = {
            field.name.replace("_", "-"): field.name
            for field in dataclasses.fields(self)
            if field.name not in ("expanded_bytes_floor", "expansion_ratio", "expanded_bytes_fixed")
        }
        names["expanded-bytes"] = "expanded_bytes_fixed"
        changes: dict[str, Any] = {}  # each value parsed for its field: an int, or a float for cpu_seconds
        for setting in settings:
            name, _, text = setting.partition("=")
            field = names.get(name.strip().lower())
            if field is None:
                raise ValueError(f"{name.strip()!r} is not a limit; the limits are {', '.join(sorted(names))}")
            changes[field] = parse_amount(text, integer=field != "cpu_seconds")
        return dataclasses.replace(self, **changes)

    def expanded_bytes(self, compressed_size: int) -> int:
        if self.expanded_bytes_fixed is not None:
            return self.expanded_bytes_fixed
        return max(self.expanded_bytes_floor, self.expansion_ratio * compressed_size)


def parse_amount(text: str, integer: bool = True) -> int | float:
    """`64M`, `8GiB`, `1.5k`, `300` → a positive number (binary multiples), at most MAX_AMOUNT."""
    match = _SIZE.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text[:40]!r} is not a positive amount like 300, 64M or 8G")
    amount = float(match.group(1)) * 1024 ** " kmgt".index((match.group(2) or " ").lower())
    if amount > MAX_AMOUNT:  # an infinity too
        raise ValueError(f"{text[:40]!r} is more than the largest amount, 1024T")
    return int(amount) if integer else amount


class Budget:
    """One input's allowance, spent by the readers; raises BudgetReached at a bound."""

    def __init__(self, limits: ReadLimits, data: TraceData | None = None) -> None:
        self.limits = limits
        self._data = data  # its span, sample and process counts are watched
        self._spans0 = data.spans.count if data is not None else 0
        self._samples0 = data.samples.count if data is not None else 0
        self._processes0 = len(data.processes) if data is not None else 0
        self._cpu0 = time.process_time()
        self._countdown = CHECK_EVERY
        self.records = 0
        self.bytes_read = 0
        self.long_lines: list[tuple[int, int]] = []  # (line, bytes) of the lines skipped for their length
        self.frame_bytes = 0
        self.skipped: list[str] = []  # the first record skipped for a field of the wrong type, and a count
        self.skipped_count = 0
        self.absent: list[str] = []  # the first field of the wrong type read as absent, and a count
        self.absent_count = 0
        self.deep: list[str] = []  # where a value nested too deep was first cut, and a count of the cuts
        self.deep_count = 0

    def tick(self) -> None:
        """One unit of work done (a span, a block): every CHECK_EVERY ticks, the bounds are looked at."""
        self._countdown -= 1
        if self._countdown <= 0:
            self._countdown = CHECK_EVERY
            self.check()

    def check(self) -> None:
        limits = self.limits
        if time.process_time() - self._cpu0 > limits.cpu_seconds:
            self._reached(f"{limits.cpu_seconds:g} CPU seconds", "cpu-seconds")
        data = self._data
        if data is not None:
            if data.spans.count - self._spans0 > limits.spans:
                self._reached(f"{limits.spans:,} spans", "spans")
            if data.samples.count - self._samples0 > limits.samples:
                self._reached(f"{limits.samples:,} memory samples", "samples")
            if len(data.processes) - self._processes0 > limits.processes:
                self._reached(f"{limits.processes:,} processes", "processes")

    def spend_frame_bytes(self, count: int) -> bool:
        """Frame file-name bytes about to be looked at; False once the snapshot's allowance is spent."""
        self.frame_bytes += count
        return self.frame_bytes <= self.limits.snapshot_frame_bytes

    def lines(self, stream: IO[bytes]) -> Iterator[bytes]:
        """The stream's lines, each at most `record_bytes` long: a longer one is read past in steps,
        counted in `long_lines`, and stands as an empty line (line numbers stay those of the file)."""
        limits = self.limits
        bound = limits.record_bytes + 1
        readline = stream.readline
        descriptor = _plain_descriptor(stream)
        lineno = 0
        while True:
            line = readline(bound)
            if not line:
                return
            lineno += 1
            size = len(line)
            if size == bound and line[-1] != 10:
                del line
                holes = 0
                while True:
                    if descriptor is not None:
                        holes += _past_hole(stream, descriptor)
                    rest = readline(SKIP_STEP_BYTES)
                    size += len(rest)
                    if self.bytes_read + size > limits.input_bytes:
                        self.bytes_read += size
                        self._reached(f"{limits.input_bytes:,} bytes", "input-bytes")
                    if not rest or rest[-1] == 10:
                        break
                self.long_lines.append((lineno, size + holes))
                line = b""
            self.bytes_read += size
            if self.bytes_read > limits.input_bytes:
                self._reached(f"{limits.input_bytes:,} bytes", "input-bytes")
            self.records += 1
            if self.records > limits.records:
                self._reached(f"{limits.records:,} records", "records")
            self._countdown -= 1
            if self._countdown <= 0:
                self._countdown = CHECK_EVERY
                self.check()
            yield line

    def skipped_record(self, where: str, reason: str) -> None:
        """A record skipped: one of its own fields has the wrong type."""
        self.skipped_count += 1
        if not self.skipped:
            self.skipped.append(f"{where}: {reason}")

    def absent_field(self, reason: str) -> None:
        """A field (an attribute) of the wrong type, read as absent."""
        self.absent_count += 1
        if not self.absent:
            self.absent.append(reason)

    def cut_deep(self, where: str, count: int) -> None:
        """`count` objects or lists of a kept value cut at the depth bound (depth.py)."""
        self.deep_count += count
        if count and not self.deep:
            self.deep.append(where)

    def reasons(self) -> list[str]:
        """What was skipped on the way, one line each: long lines, records and fields of the wrong type."""
        found = []
        if self.long_lines:
            (first, size), count = self.long_lines[0], len(self.long_lines)
            found.append(
                f"{count:,} line{'s' if count != 1 else ''} longer than the record bound of {self.limits.record_bytes:,} "
                f"bytes skipped (the first: line {first:,}, {size:,} bytes); --max record-bytes=… raises it"
            )
        if self.skipped_count:
            found.append(
                f"{self.skipped_count:,} record{'s' if self.skipped_count != 1 else ''} with a field of the wrong type "
                f"skipped (the first: {self.skipped[0]})"
            )
        if self.absent_count:
            found.append(
                f"{self.absent_count:,} field{'s' if self.absent_count != 1 else ''} of the wrong type read as absent "
                f"(the first: {self.absent[0]})"
            )
        if self.deep_count:
            found.append(
                f"{self.deep_count:,} part{'s' if self.deep_count != 1 else ''} of values nested deeper than {MAX_DEPTH} "
                f"levels cut there (the first in {self.deep[0]})"
            )
        return found

    def _reached(self, what: str, name: str) -> None:
        raise BudgetReached(
            f"reading stopped at its bound of {what} (--max {name}=… raises it); what came before was read"
        )


def _plain_descriptor(stream: IO[bytes]) -> int | None:
    """The file descriptor under a buffered plain file (where holes can be found), else None."""
    raw = getattr(stream, "raw", None)
    return raw.fileno() if isinstance(raw, io.FileIO) and hasattr(os, "SEEK_DATA") else None


def _past_hole(stream: IO[bytes], descriptor: int) -> int:
    """Move a plain file's stream past a hole at its position (a sparse file's unwritten bytes read as
    zeros: no line ends there, nothing to read); returns the hole's size."""
    here = stream.tell()
    try:
        data_at = os.lseek(descriptor, here, os.SEEK_DATA)
    except OSError as error:
        if error.errno != errno.ENXIO:  # ENXIO: only a hole from here to the end
            stream.seek(here)
            return 0
        data_at = os.fstat(descriptor).st_size
    stream.seek(data_at)  # also puts back the position the buffered stream keeps
    return max(0, data_at - here)


_current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("vlmtrace_read_budget", default=None)


def current() -> Budget:
    """The budget of the input being read (a default one where none was set: a caller reading bytes
    it fetched itself)."""
    budget = _current.get()
    return budget if budget is not None else Budget(ReadLimits())


def reading(budget: Budget) -> contextvars.Token:
    return _current.set(budget)


def done(token: contextvars.Token) -> None:
    _current.reset(token)
