"""`vlmtrace top`'s frame: the live view (analysis/live.py) as rich tables, one block per running process,
then the processes that ended and the last crash. Every name from the journal reaches the terminal as
text (report/terminal.py): a span named with an escape sequence or with rich markup is shown as named."""

from __future__ import annotations

import itertools
import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from vlmtrace.analysis import (
    CLASS_NAMES,
    COMPONENT_NAMES,
    LiveView,
    ProcessNow,
    format_bytes,
    format_count,
    format_seconds,
    is_leak,
)
from vlmtrace.report.terminal import plain, printable

FATAL_LINES_SHOWN = 6
STAGES_SHOWN = 8  # in the in-flight title, the stages with most spans first


def _age(t_ns: int | None, now_ns: int) -> str:
    return "n/a" if t_ns is None else format_seconds(max(0.0, (now_ns - t_ns) / 1e9)) + " ago"


def _title(process: ProcessNow, now_ns: int) -> Text:
    state = process.state
    service = f" ({printable(state.service)})" if state.service else ""
    if state.ended:
        service += " — ended, as it was at its last record"
    rate = f", {process.request_rate:.1f}/s" if process.request_rate else ""
    partial = " since the follower started" if state.started_mid_file else ""
    return Text.assemble(
        (f"{printable(state.label)}{service}", "bold"),
        f" — {format_count(state.requests_completed)} requests completed{partial}{rate}, "
        f"{process.requests_in_flight} in flight; last record {_age(state.last_record_ns, now_ns)}",
    )


def _devices(process: ProcessNow) -> Table | None:
    if not process.devices:
        return None
    table = Table(title="memory per device", title_justify="left", expand=False)
    for name in ("device", "tensors", "cache", "native", "GPU in use / size", "growth per request", "requests to OOM"):
        table.add_column(name, justify="left" if name == "device" else "right")
    for device in process.devices:
        outlook = device.outlook
        size = f"{format_bytes(outlook.used_bytes)} / {format_bytes(outlook.total_bytes)}"
        to_oom = "—" if outlook.requests_to_oom is None else f"~{format_count(outlook.requests_to_oom)}"
        if outlook.seconds_to_oom is not None:
            to_oom += f" (~{format_seconds(outlook.seconds_to_oom)})"
        table.add_row(
            plain(device.name),
            *(format_bytes(device.components.get(key)) for key in ("tensor", "cache", "native")),
            size,
            format_bytes(outlook.slope_bytes_per_request, signed=True) if outlook.slope_bytes_per_request else "—",
            to_oom,
        )
    return table


def _growth(process: ProcessNow) -> Table:
    table = Table(title=f"growth per request over the last {process.window_requests} requests", title_justify="left")
    for name in ("component", "now", "per request", "95% interval", "verdict (window)"):
        table.add_column(name, justify="right" if name in ("now", "per request", "95% interval") else "left")
    for item in process.components:
        if item.level is None and item.fit is None:
            continue
        fit = item.fit
        verdict = (
            Text("too few requests yet", "dim")
            if item.klass is None
            else Text(CLASS_NAMES[item.klass], "bold red" if is_leak(item.klass) else "")
        )
        table.add_row(
            COMPONENT_NAMES[item.component],
            format_bytes(item.level),
            format_bytes(fit.slope, signed=True) if fit else "—",
            f"{format_bytes(fit.low, signed=True)} … {format_bytes(fit.high, signed=True)}" if fit else "—",
            verdict,
        )
    return table


def _in_flight(process: ProcessNow, now_ns: int) -> RenderableType:
    if not process.in_flight_by_stage:
        return Text("nothing in flight", "dim")
    stages = ", ".join(
        f"{printable(stage)} {count}"
        for stage, count in itertools.islice(process.in_flight_by_stage.items(), STAGES_SHOWN)
    )
    if len(process.in_flight_by_stage) > STAGES_SHOWN:
        stages += f" and {len(process.in_flight_by_stage) - STAGES_SHOWN} more stages"
    left_out = f" (+{process.state.in_flight_left_out} not kept)" if process.state.in_flight_left_out else ""
    table = Table(title=Text(f"in flight: {stages}{left_out}"), title_justify="left", show_header=True)
    for name in ("oldest spans", "stage", "started"):
        table.add_column(name)
    for span in process.oldest_in_flight:
        table.add_row(plain(span.name), plain(span.stage or "—"), _age(span.start_ns, now_ns))
    return table


def _crash(view: LiveView, now_ns: int) -> RenderableType:
    crash = view.last_crash
    if crash is None:
        return Text("no crash", "dim")
    spans = sorted(crash.in_flight.values(), key=lambda span: span.start_ns)
    where = " → ".join(printable(f"{span.name} [{span.stage}]" if span.stage else span.name) for span in spans[:8])
    lines = [
        Text.assemble(
            ("last crash: ", "bold red"),
            f"{printable(crash.label)} stopped without a clean end, last record {_age(crash.last_record_ns, now_ns)}",
        ),
        Text(f"{len(spans)} span{'s' if len(spans) != 1 else ''} in flight" + (f": {where}" if where else "")),
    ]
    memory = ", ".join(
        f"{COMPONENT_NAMES[key]} {format_bytes(value)}"
        for key, value in view.last_crash_memory.items()
        if value is not None
    )
    if memory:
        lines.append(Text(f"last sample: {memory}"))
    fatal = [line for line in crash.fatal if line.strip()][:FATAL_LINES_SHOWN]
    lines += [plain(line, "red" if index == 0 else "dim") for index, line in enumerate(fatal)]
    return Group(*lines)


def render(view: LiveView, now_ns: int | None = None) -> RenderableType:
    now_ns = now_ns or time.time_ns()
    parts: list[RenderableType] = [plain(f"vlmtrace top — {view.target}", "bold")]
    if not view.running and not view.ended:
        parts.append(Text("no journal records yet", "dim"))
    for process in view.running or ([view.last_ended] if view.last_ended else []):
        parts.append(Text(""))
        parts.append(_title(process, now_ns))
        devices = _devices(process)
        if devices is not None:
            parts.append(devices)
        parts.append(_growth(process))
        parts.append(_in_flight(process, now_ns))
    if view.ended:
        parts.append(Text(""))
        parts.append(
            Text(
                "ended: "
                + ", ".join(
                    f"{printable(p.label)} ({'clean end' if p.clean_end else 'journal stopped: disk full' if p.journal_stopped else 'crashed'})"
                    for p in view.ended
                ),
                "dim",
            )
        )
    parts.append(_crash(view, now_ns))
    if view.running_forgotten:
        parts.append(
            Text(f"{view.running_forgotten} more running processes not followed (the least recently active)", "yellow")
        )
    if view.unreadable_lines:
        parts.append(Text(f"{view.unreadable_lines} unreadable lines skipped", "yellow"))
    return Group(*parts)
