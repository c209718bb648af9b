"""The diff on the terminal: one rich table, a row per memory component, and a sentence per change.
Names from the runs (processes, stages) reach the table as text (report/terminal.py), never as markup."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from vlmtrace.analysis import (
    CLASS_NAMES,
    COMPONENT_NAMES,
    FIXED,
    INCONCLUSIVE,
    REGRESSED,
    Comparison,
    ComponentChange,
    RunSlope,
    format_bytes,
)
from vlmtrace.report.terminal import plain

STYLES = {REGRESSED: "bold red", FIXED: "bold green", INCONCLUSIVE: "yellow"}
NO_FITS = "Nothing to compare: neither run has enough requests with memory readings to fit a slope (at least 5)."


def slope_text(side: RunSlope | None) -> str:
    if side is None:
        return "—"
    return (
        f"{format_bytes(side.slope, signed=True)}/request "
        f"[{format_bytes(side.low, signed=True)} … {format_bytes(side.high, signed=True)}]"
    )


def _side(side: RunSlope | None) -> Text:
    if side is None:
        return Text("no readings", style="dim")
    interval = f"[{format_bytes(side.low, signed=True)}, {format_bytes(side.high, signed=True)}]"
    return Text.assemble(
        format_bytes(side.slope, signed=True),
        ("\n" + interval, "dim"),
        ("\n" + CLASS_NAMES[side.klass], "red" if side.leaks else "dim"),
    )


def _stage(change: ComponentChange) -> Text:
    stages = [side.stage or "—" if side else "—" for side in (change.before, change.after)]
    return plain(stages[0] if stages[0] == stages[1] else f"{stages[0]} → {stages[1]}")


def verdict_line(change: ComponentChange) -> str:
    """`torch tensors (allocated): regressed — +0 B/request … → +4.00 MiB/request …; the after run grows faster …`"""
    return (
        f"{COMPONENT_NAMES[change.component]}: {change.verdict} — {slope_text(change.before)} → "
        f"{slope_text(change.after)}; {change.reason}"
    )


def comparison_table(comparison: Comparison) -> Table:
    several = (
        len(
            {(c.before.process if c.before else None, c.after.process if c.after else None) for c in comparison.changes}
        )
        > 1
    )
    table = Table(title="Memory growth per request: slope, 95% interval, class", title_justify="left")
    table.add_column("component")
    if several:
        table.add_column("process (before → after)")
    table.add_column("before")
    table.add_column("after")
    table.add_column("stage", overflow="fold")
    table.add_column("verdict")
    for change in comparison.changes:
        cells: list[str | Text] = [COMPONENT_NAMES[change.component]]
        if several:
            cells.append(plain(" → ".join(side.process if side else "—" for side in (change.before, change.after))))
        table.add_row(
            *cells,
            _side(change.before),
            _side(change.after),
            _stage(change),
            Text(change.verdict, STYLES.get(change.verdict, "")),
        )
    return table
