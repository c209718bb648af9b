"""The normalised form every reader fills: tables of spans and memory readings (analysis/step1_loading/columns.py),
the processes they came from, plus what went wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlmtrace import semconv as sc
from vlmtrace.analysis.step1_loading.columns import DeviceColumns, SampleColumns, SpanColumns

MAX_PROBLEMS_PER_SOURCE = 100


@dataclasses.dataclass
class Problem:
    """Something a reader skipped or could not read: named by file and line so a person can look."""

    source: str
    line: int | None
    reason: str
    severity: str = "error"  # "error": bad input (exit code 2); "note": expected after a crash

    def describe(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.reason}"


@dataclasses.dataclass
class ProcessInfo:
    label: str
    host: str | None = None
    pid: int | None = None
    service: str | None = None
    resource: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    argv: list = dataclasses.field(default_factory=list)
    from_journal: bool = False
    clean_end: bool = False
    ended_by: str | None = None  # the end record's: the signal that ended the process, "uncaught NAME"
    end_unread: bool = False  # the journal could not be read to its end (cut-off or over-large gzip)
    last_record_ns: int | None = None
    sources: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class InFlightSpan:
    """A span with a journal start record and no end record: running when the process stopped."""

    process: int
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int | None
    kind: str | None
    thread: str | None
    attributes: dict
    links: list


@dataclasses.dataclass
class FatalBlock:
    """faulthandler's plain-text report, found after the last JSON record of a journal."""

    process: int
    source: str
    line: int
    text: str


@dataclasses.dataclass
class InputInfo:
    source: str
    format: str
    spans: int = 0
    samples: int = 0


class TraceData:
    """Everything read from all inputs, in one normalised form."""

    def __init__(self) -> None:
        self.spans = SpanColumns()
        self.samples = SampleColumns()
        self.devices = DeviceColumns()
        self.processes: list[ProcessInfo] = []
        self._process_by_label: dict[str, int] = {}
        self.in_flight: list[InFlightSpan] = []
        self.fatal: list[FatalBlock] = []
        self.problems: list[Problem] = []
        self._problem_counts: dict[str, int] = {}
        self._problem_overflow: dict[str, Problem] = {}
        self.inputs: list[InputInfo] = []
        self.warnings: list[dict] = []
        self.dropped: dict[str, int] = {}
        self.snapshots: list[Any] = []
        self.captures: list[Any] = []  # readers/captures.py's Capture records

    def process(self, label: str, **facts: Any) -> int:
        """Index of the process called `label`, created on first sight; later facts fill blanks."""
        index = self._process_by_label.get(label)
        if index is None:
            index = len(self.processes)
            self._process_by_label[label] = index
            self.processes.append(ProcessInfo(label=label))
        info = self.processes[index]
        for key, value in facts.items():
            if value is not None and not getattr(info, key):
                setattr(info, key, value)
        return index

    def merge_processes(self, part: TraceData) -> dict[int, int]:
        """The processes another TraceData read (a later file, read in another process) merged into these,
        as if read here; returns its process numbering in this one."""
        process_map: dict[int, int] = {}
        for index, info in enumerate(part.processes):
            target = self.process(
                info.label,
                host=info.host,
                pid=info.pid,
                service=info.service,
                resource=info.resource,
                versions=info.versions,
                argv=info.argv,
                from_journal=info.from_journal or None,
            )
            mine = self.processes[target]
            mine.clean_end = mine.clean_end or info.clean_end
            mine.ended_by = mine.ended_by or info.ended_by
            mine.end_unread = mine.end_unread or info.end_unread
            if info.last_record_ns is not None:
                mine.last_record_ns = max(mine.last_record_ns or info.last_record_ns, info.last_record_ns)
            mine.sources.extend(source for source in info.sources if source not in mine.sources)
            process_map[index] = target
        return process_map

    def absorb(self, part: TraceData, process_map: dict[int, int]) -> None:
        """Append the rest of what `part` read, its processes numbered by `merge_processes`."""
        self.spans.absorb(part.spans, process_map)
        self.samples.absorb(part.samples, process_map)
        self.devices.absorb(part.devices, process_map)
        self.problems.extend(part.problems)
        for source, count in part._problem_counts.items():
            self._problem_counts[source] = self._problem_counts.get(source, 0) + count
        self._problem_overflow.update(part._problem_overflow)
        for span in part.in_flight:
            span.process = process_map[span.process]
            self.in_flight.append(span)
        for block in part.fatal:
            block.process = process_map[block.process]
            self.fatal.append(block)
        self.inputs.extend(part.inputs)
        self.warnings.extend(part.warnings)
        for key, value in part.dropped.items():
            self.dropped[key] = max(self.dropped.get(key, 0), value)
        self.snapshots.extend(part.snapshots)
        for capture in part.captures:
            capture.process = process_map[capture.process]
            self.captures.append(capture)

    def add_span(
        self,
        process: int,
        trace_id: Any,
        span_id: Any,
        parent_id: Any,
        name: Any,
        status: Any,
        start_ns: Any,
        end_ns: Any,
        attributes: dict,
    ) -> None:
        """An ended span, with its per-device readings when it has them."""
        self.spans.append_head(
            process, (trace_id, span_id, parent_id or None, name, status, start_ns, end_ns), attributes
        )
        if sc.MEM_DEVICES in attributes:
            self.devices.append(process, end_ns, attributes)

    def problem(self, source: str, line: int | None, reason: str, severity: str = "error") -> None:
        """Record a problem; past MAX_PROBLEMS_PER_SOURCE in one file, one entry stands for the rest
        (a single line can hold a million malformed records)."""
        count = self._problem_counts[source] = self._problem_counts.get(source, 0) + 1
        if count <= MAX_PROBLEMS_PER_SOURCE:
            self.problems.append(Problem(source, line, reason, severity))
        elif count == MAX_PROBLEMS_PER_SOURCE + 1:
            self._problem_overflow[source] = Problem(
                source, None, f"more than {MAX_PROBLEMS_PER_SOURCE} problems; the rest are not listed", severity
            )
            self.problems.append(self._problem_overflow[source])
        elif severity == "error":
            self._problem_overflow[source].severity = "error"
