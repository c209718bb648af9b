"""Where a process died: the spans in flight, their chain (pipeline → request → step), the last
memory samples, and the stacks faulthandler wrote into the journal.

A journal without an `end_marker` belongs to a process that died — or is still running; the report
says which spans were open at its last record either way.
"""

from __future__ import annotations

import dataclasses
import re

import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.tables import Tables
from vlmtrace.analysis.trace_data import FatalBlock, InFlightSpan, TraceData

LAST_SAMPLES = 5
_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")


@dataclasses.dataclass
class FatalReport:
    source: str
    line: int
    title: str
    threads: list[dict]
    text: str


@dataclasses.dataclass
class CrashedProcess:
    process: str
    last_record_ns: int | None
    in_flight: list[InFlightSpan]
    chains: list[list[InFlightSpan]]
    linked_requests: dict[str, list[str]]  # step span id → names of the request spans it served
    last_samples: pd.DataFrame
    fatal: list[FatalReport]


def parse_fatal(block: FatalBlock) -> FatalReport:
    """Split faulthandler's text into its title and one entry per thread with its frames."""
    lines = block.text.splitlines()
    title = next((line for line in lines if line.startswith("Fatal Python error")), lines[0] if lines else "")
    threads: list[dict] = []
    for line in lines:
        header = _THREAD_HEADER.match(line)
        if header:
            threads.append({"thread": header.group(2), "current": header.group(1) == "Current thread", "frames": []})
        elif threads and line.startswith("  ") and line.strip():
            threads[-1]["frames"].append(line.strip())
    return FatalReport(block.source, block.line, title, threads, block.text)


def _chains(spans: list[InFlightSpan]) -> list[list[InFlightSpan]]:
    """Root-to-leaf chains through the in-flight spans, one per span that has no in-flight child."""
    by_id = {span.span_id: span for span in spans}
    parents = {span.parent_id for span in spans if span.parent_id}
    chains = []
    for leaf in spans:
        if leaf.span_id in parents:
            continue
        chain, current, seen = [], leaf, set()
        while current is not None and current.span_id not in seen:
            seen.add(current.span_id)
            chain.append(current)
            current = by_id.get(current.parent_id) if current.parent_id else None
        chains.append(chain[::-1])
    return sorted(chains, key=lambda chain: chain[0].start_ns or 0)


def _linked_requests(spans: list[InFlightSpan], tables: Tables) -> dict[str, list[str]]:
    """Engine-step spans link to the request spans of their batch; name those requests."""
    names = {span.span_id: span.name for span in spans}
    ended = tables.spans
    linked: dict[str, list[str]] = {}
    for span in spans:
        targets = [link.get("span_id") for link in span.links if isinstance(link.get("span_id"), str)]
        if not targets:
            continue
        missing = [target for target in targets if target not in names]
        if missing and len(ended):
            found = ended.loc[ended["span_id"].isin(missing), ["span_id", "name"]]
            names.update(zip(found["span_id"], found["name"].astype(str)))
        linked[span.span_id] = [names.get(target, target) for target in targets]
    return linked


def crashed_processes(data: TraceData, tables: Tables) -> list[CrashedProcess]:
    """Every journal process without a clean end marker."""
    result = []
    for index, info in enumerate(data.processes):
        if not info.from_journal or info.clean_end:
            continue
        in_flight = sorted((span for span in data.in_flight if span.process == index), key=lambda s: s.start_ns or 0)
        samples = tables.readings[
            (tables.readings["process"] == index) & (tables.readings["origin"] == 0)
        ].tail(LAST_SAMPLES)
        result.append(
            CrashedProcess(
                process=info.label,
                last_record_ns=info.last_record_ns,
                in_flight=in_flight,
                chains=_chains(in_flight),
                linked_requests=_linked_requests(in_flight, tables),
                last_samples=samples,
                fatal=[parse_fatal(block) for block in data.fatal if block.process == index],
            )
        )
    return result


def stage_of(span: InFlightSpan) -> str | None:
    stage = span.attributes.get(sc.STAGE)
    return stage if isinstance(stage, str) else None
