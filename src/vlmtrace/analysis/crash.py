"""Where a process died, or stands while it still runs: the spans in flight, their chain (pipeline →
request → step), the last memory samples, the stacks faulthandler wrote into the journal, and what to do
about it. How each process ended is endings.py's.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis import copied
from vlmtrace.analysis.endings import FatalReport, fatal_of, process_ending
from vlmtrace.analysis.step2_preparing.tables import Tables
from vlmtrace.analysis.trace_data import InFlightSpan, TraceData

LAST_SAMPLES = 5
NEAR_FULL = 0.95  # GPU memory in use over this share at the last sample: the crash may be an out-of-memory
CHAIN_SPANS = 12
MAX_CHAIN_GROUPS = 20


@dataclasses.dataclass
class ChainGroup:
    """In-flight chains with the same span names: the first of them, and how many there were."""

    spans: list[InFlightSpan]  # root first; when `elided`, that many spans between the root and the next are left out
    count: int
    elided: int


@dataclasses.dataclass
class CrashedProcess:
    process: str
    ending: str  # process_ending's sentence
    last_record_ns: int | None
    in_flight: list[InFlightSpan]
    chain_groups: list[ChainGroup]
    chain_groups_left_out: int
    linked_requests: dict[str, list[str]]  # step span id → names of the request spans it served
    last_samples: pd.DataFrame
    fatal: list[FatalReport]  # the first copied.FATAL_REPORTS
    fatal_left_out: int = 0

    @property
    def chains(self) -> list[list[InFlightSpan]]:
        return [group.spans for group in self.chain_groups]

    @property
    def crashed(self) -> bool:
        """Died without a clean end (a fatal signal, or killed); not a process still running."""
        return not self.ending.startswith("still running")


def _roots_and_depths(spans: list[InFlightSpan]) -> tuple[dict[str, InFlightSpan], dict[str, int]]:
    """Each span's chain root and depth, computed once per span (a parent loop ends the chain)."""
    by_id = {span.span_id: span for span in spans}
    root: dict[str, InFlightSpan] = {}
    depth: dict[str, int] = {}
    for span in spans:
        path, seen, current = [], set(), span
        while current.span_id not in root and current.span_id not in seen:
            seen.add(current.span_id)
            path.append(current)
            parent = by_id.get(current.parent_id) if current.parent_id else None
            if parent is None:
                break
            current = parent
        if current.span_id in root:
            top, base = root[current.span_id], depth[current.span_id] + 1
        else:
            top, base = path[-1], 0
        for offset, step in enumerate(reversed(path)):
            root[step.span_id], depth[step.span_id] = top, base + offset
    return root, depth


def _chain_groups(spans: list[InFlightSpan]) -> tuple[list[ChainGroup], int]:
    """Root-to-leaf chains through the in-flight spans, one per span that has no in-flight child,
    grouped by the names along them; returns at most MAX_CHAIN_GROUPS groups and how many were left out.

    A chain keeps its root and the CHAIN_SPANS spans nearest its leaf, so a deep chain with many
    leaves (leaves × depth) cannot grow the report without bound."""
    by_id = {span.span_id: span for span in spans}
    parents = {span.parent_id for span in spans if span.parent_id}
    root, depth = _roots_and_depths(spans)
    groups: dict[tuple, ChainGroup] = {}
    for leaf in spans:
        if leaf.span_id in parents:
            continue
        tail: list[InFlightSpan] = []
        current: InFlightSpan | None = leaf
        while current is not None and len(tail) < CHAIN_SPANS:
            tail.append(current)
            current = by_id.get(current.parent_id) if current.parent_id and current is not root[leaf.span_id] else None
        top = root[leaf.span_id]
        chain = tail[::-1] if tail[-1] is top else [top, *tail[::-1]]
        elided = max(0, depth[leaf.span_id] + 1 - len(chain))
        key = (elided, *(span.name for span in chain))
        if key in groups:
            groups[key].count += 1
        else:
            groups[key] = ChainGroup(chain, 1, elided)
    ordered = sorted(groups.values(), key=lambda group: group.spans[0].start_ns or 0)
    return ordered[:MAX_CHAIN_GROUPS], max(0, len(ordered) - MAX_CHAIN_GROUPS)


def _linked_requests(shown: list[InFlightSpan], spans: list[InFlightSpan], tables: Tables) -> dict[str, list[str]]:
    """Engine-step spans link to the request spans of their batch; name those requests, for the spans
    `shown` in the chains: at most copied.LINKED_REQUESTS names each, then how many more."""
    names = {span.span_id: span.name for span in spans}
    ended = tables.spans
    linked: dict[str, list[str]] = {}
    for span in shown:
        targets = [link.get("span_id") for link in span.links if isinstance(link.get("span_id"), str)]
        more = len(targets) - copied.LINKED_REQUESTS
        targets = targets[: copied.LINKED_REQUESTS]
        if not targets:
            continue
        missing = [target for target in targets if target not in names]
        if missing and len(ended):
            found = ended.loc[ended["span_id"].isin(missing), ["span_id", "name"]]
            names.update(zip(found["span_id"], found["name"].astype(str), strict=True))
        linked[span.span_id] = [copied.cut(names.get(target, target), copied.VALUE_CHARS) for target in targets]
        if more > 0:
            linked[span.span_id].append(f"… and {more} more")
    return linked


def crashed_processes(data: TraceData, tables: Tables) -> list[CrashedProcess]:
    """Every journal process without a clean end marker: crashed, killed, or still running."""
    result = []
    for index, info in enumerate(data.processes):
        if not info.from_journal or info.clean_end or info.end_unread:
            continue
        fatal, fatal_left_out = fatal_of(data, index)
        in_flight = sorted((span for span in data.in_flight if span.process == index), key=lambda s: s.start_ns or 0)
        samples = tables.readings[(tables.readings["process"] == index) & (tables.readings["origin"] == 0)].tail(
            LAST_SAMPLES
        )
        groups, left_out = _chain_groups(in_flight)
        result.append(
            CrashedProcess(
                process=info.label,
                ending=process_ending(info, fatal) or "",
                last_record_ns=info.last_record_ns,
                in_flight=in_flight,
                chain_groups=groups,
                chain_groups_left_out=left_out,
                linked_requests=_linked_requests([span for group in groups for span in group.spans], in_flight, tables),
                last_samples=samples,
                fatal=fatal,
                fatal_left_out=fatal_left_out,
            )
        )
    return result


def stage_of(span: InFlightSpan) -> str | None:
    stage = span.attributes.get(sc.STAGE)
    return stage if isinstance(stage, str) else None


def crash_advice(item: CrashedProcess) -> list[tuple[str, str]]:
    """What to do about this stop, as (action, detail) pairs: where it stopped, whether memory was
    full, and how to reproduce it with the inputs that were in flight."""
    advice = []
    current = next((stack for report in item.fatal for stack in report.stacks if stack["current"]), None)
    if item.fatal:
        title = item.fatal[0].title or "a fatal signal"
        where = current["frames"][0] if current and current["frames"] else "the current thread (no Python frame)"
        advice.append(
            (
                f"Start from where it stopped: {title}",
                f"The current thread's most recent Python frame was {where}. Frames of other threads that only "
                "wait (thread pools, queues) are grouped below; a signal raised inside a native extension (CUDA, "
                "the engine) shows its last Python caller here, so run again with CUDA_LAUNCH_BLOCKING=1 to stop "
                "at the failing kernel.",
            )
        )
    elif not item.crashed:
        advice.append(
            (
                "It is still running: this is its state at its last record",
                "Its journal is still open. Run the report again once it has stopped to see how it ended.",
            )
        )
    else:
        advice.append(
            (
                "Find out what stopped it: there is no fatal-signal report",
                "A process killed with SIGKILL (the kernel's OOM killer, a container limit, a scheduler) leaves "
                "no report: look for 'Out of memory: Killed process' in `dmesg` or `journalctl -k`, and at the "
                "container's exit reason (137 is SIGKILL).",
            )
        )
    samples = item.last_samples
    if len(samples) and {"gpu_used", "gpu_total"} <= set(samples.columns):
        used, total = samples["gpu_used"].iloc[-1], samples["gpu_total"].iloc[-1]
        if pd.notna(used) and pd.notna(total) and total > 0:
            share = used / total
            if share >= NEAR_FULL:
                advice.append(
                    (
                        f"GPU memory was {share:.0%} full at the last sample: suspect an out-of-memory",
                        "Lower the engine's KV-cache share (cache_max_entry_count), the batch size or the image "
                        "size, then compare this chart's last seconds with a run that survives.",
                    )
                )
            else:
                advice.append(
                    (
                        f"GPU memory was {share:.0%} full at the last sample: not an out-of-memory",
                        "Memory left room, so look at the stack and the inputs in flight instead of the allocator.",
                    )
                )
    if item.chain_groups:
        count = sum(group.count for group in item.chain_groups)
        advice.append(
            (
                f"Reproduce with the {count} request chain{'s' if count != 1 else ''} that were in flight",
                "Their spans, listed under “Where the process stopped”, carry the inputs' sizes (images, pixels, "
                "tokens) and trace ids; replaying those requests alone tells whether one input causes the stop or "
                "the load does.",
            )
        )
    return advice
