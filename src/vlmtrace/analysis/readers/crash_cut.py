"""What a crash leaves in a journal, as the journal reader (journal.py) takes it: faulthandler's report
(a `fatal` block), the record the process was writing when it died, lines that are neither, and the spans
whose start record has no end (in flight when the process stopped).
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from vlmtrace.analysis.readers import compact_records, typed
from vlmtrace.analysis.readers.depth import MAX_DEPTH, text, within_depth
from vlmtrace.analysis.trace_data import FatalBlock, InFlightSpan, TraceData

FATAL_BLOCKS_KEPT = 20  # faulthandler reports kept of one file
SPAN_TEXT_CHARS = 1000  # of an in-flight span's name, ids, kind and thread


def cut_short(data: TraceData, source: str, suspect: tuple[int, bytes]) -> None:
    """A bad line just before a fatal report or the end of the file: a record cut by the crash."""
    if suspect[1].lstrip().startswith(b"{"):
        data.problem(
            source, suspect[0], "truncated last record (the process stopped while writing it); skipped", "note"
        )
    else:
        corrupt(data, source, suspect)


def corrupt(data: TraceData, source: str, suspect: tuple[int, bytes]) -> None:
    preview = suspect[1][:60].decode("utf-8", "replace").strip()
    data.problem(source, suspect[0], f"not valid JSON and not a faulthandler report: {preview!r}")


def fatal_block(data: TraceData, process: int, source: str, line: int, lines: list[str], cut: int) -> None:
    """A faulthandler report (at most FATAL_BLOCKS_KEPT of a file; its lines past a bound counted)."""
    kept = sum(1 for block in data.fatal if block.source == source)
    if kept >= FATAL_BLOCKS_KEPT:
        if kept == FATAL_BLOCKS_KEPT:
            data.problem(
                source,
                line,
                f"more than {FATAL_BLOCKS_KEPT} faulthandler reports in this file; the later ones are not kept",
                "note",
            )
            data.fatal.append(FatalBlock(process, source, line, "… later faulthandler reports not kept"))
        return
    report = "\n".join(lines).strip("\n")
    if cut:
        report += f"\n… {cut:,} more lines not kept"
        data.problem(
            source,
            line,
            f"a faulthandler report of {len(lines) + cut:,} lines: the first {len(lines):,} "
            f"were kept, {cut:,} more lines not kept",
            "note",
        )
    data.fatal.append(FatalBlock(process, source, line, report))


def in_flight(data: TraceData, process: int, starts: Iterable[bytes], keys: compact_records.Declared | None) -> None:
    """A process's start records that never ended, as in-flight spans (their values cut at the depth bound,
    the cuts named). `keys`: what its format 3 header declares, None where unknown (another process read its header)."""
    cut = 0
    for line in starts:
        record = orjson.loads(line)
        if keys is not None or "kind" not in record or type(record.get("mem")) is list:  # format 3
            record = compact_records.start_fields(record, keys or compact_records.OWN)
        attributes = record.get("attrs") if isinstance(record.get("attrs"), dict) else {}
        if isinstance(record.get("mem"), dict):
            attributes = {**record["mem"], **attributes}
        attributes, attributes_cut = within_depth(typed.checked_attributes(attributes))
        links, links_cut = within_depth(
            [link for link in record.get("links") or () if isinstance(link, dict)]
            if isinstance(record.get("links"), list)
            else []
        )
        cut += attributes_cut + links_cut
        start = record.get("t")
        data.in_flight.append(
            InFlightSpan(
                process=process,
                name=text(record.get("name"), SPAN_TEXT_CHARS),
                trace_id=text(record.get("trace_id"), SPAN_TEXT_CHARS),
                span_id=text(record.get("span_id"), SPAN_TEXT_CHARS),
                parent_id=record.get("parent_id") if isinstance(record.get("parent_id"), str) else None,
                start_ns=start if type(start) is int and 0 <= start < 2**63 else None,
                kind=text(record.get("kind"), SPAN_TEXT_CHARS) if record.get("kind") is not None else None,
                thread=text(record.get("thread"), SPAN_TEXT_CHARS) if record.get("thread") is not None else None,
                attributes=attributes,
                links=links,
            )
        )
    if cut:
        data.problem(
            data.processes[process].label,
            None,
            f"{cut:,} part{'s' if cut != 1 else ''} of in-flight spans' attributes or links "
            f"nested deeper than {MAX_DEPTH} levels cut there",
        )
