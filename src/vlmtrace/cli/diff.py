"""`vlmtrace diff BEFORE AFTER`: two runs analysed alike, each memory component's slope compared, a
verdict per component (fixed, regressed, unchanged, inconclusive), and an exit code for CI.

A run is a journal file or directory, or any trace file `report` reads; with --tempo or --jaeger, a
run that is not a path is pulled: trace ids (comma-separated hex) or a query (TraceQL for Tempo, a
service name for Jaeger). Exit codes: cli/traces.py; docs/analysis.md explains them.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from vlmtrace.cli.traces import (
    EXIT_BAD_INPUT,
    EXIT_FLAGGED,
    MAX_MB,
    Bounds,
    Limit,
    Lookback,
    MaxMb,
    Timeout,
    internal_error,
    lookback_seconds,
    needs_report_extra,
    read_limits,
    read_traces,
    refuse_options_without,
    refuse_to_overwrite,
)
from vlmtrace.report.output import replace_file
from vlmtrace.report.terminal import escaped, new_console, plain

if TYPE_CHECKING:
    from vlmtrace.analysis.pipeline import Analysis
    from vlmtrace.analysis.readers.budget import ReadLimits

_TRACE_IDS = re.compile(r"^[0-9a-fA-F]{16,32}(,[0-9a-fA-F]{16,32})*$")


@dataclasses.dataclass(frozen=True)
class PullSettings:
    """Where and how a run that is not a path is pulled (the same for both runs)."""

    backends: list[tuple[str, str]]  # ("tempo" | "jaeger", base URL)
    limit: int | None
    lookback_s: int
    timeout_s: float
    budget_bytes: int
    bounds: ReadLimits


def diff(
    ctx: typer.Context,
    before: Annotated[str, typer.Argument(metavar="BEFORE", hidden=True, show_default=False)],
    after: Annotated[str, typer.Argument(metavar="AFTER", hidden=True, show_default=False)],
    output: Annotated[
        Path, typer.Option("-o", "--output", metavar="PATH", help="Where to write the HTML page.")
    ] = Path("vlmtrace-diff.html"),
    json_path: Annotated[
        Path | None, typer.Option("--json", metavar="PATH", help="Also write the comparison as JSON here.")
    ] = None,
    fail_on_regression: Annotated[
        bool, typer.Option("--fail-on-regression", help="Exit with 1 when a component regressed.")
    ] = False,
    tempo: Annotated[
        str | None, typer.Option(metavar="URL", help="Pull runs that are not paths from this Tempo base URL.")
    ] = None,
    jaeger: Annotated[
        str | None, typer.Option(metavar="URL", help="Pull runs that are not paths from this Jaeger query base URL.")
    ] = None,
    limit: Limit = None,
    lookback: Lookback = "1h",
    timeout: Timeout = 60.0,
    max_mb: MaxMb = MAX_MB,
    bounds: Bounds = None,
    debug: Annotated[bool, typer.Option("--debug", help="On an internal error, print the traceback.")] = False,
) -> None:
    """Compare the memory growth of two runs, per component.

    BEFORE is the run compared against, AFTER the run judged: each a journal file or directory, a trace
    file, or (with --tempo or --jaeger) trace ids or a query. For each memory component: the slope per
    request of each run with its 95% interval, and whether the change is fixed, regressed, unchanged or
    inconclusive.

    \b
    Exit codes:
      0  no component regressed (or one did, without --fail-on-regression)
      1  a component regressed, with --fail-on-regression
      2  bad or empty input in either run, an option or VLMTRACE_REPORT_*
         variable out of its range, or an output that is an input
      3  internal error: the traceback is written to a file (--debug prints it)
      4  the report extra is not installed: pip install 'vlmtrace[report]'
    """
    refuse_options_without(ctx, ("tempo", "jaeger"), ("limit", "lookback", "timeout", "max_mb"))
    console = new_console(stderr=True, soft_wrap=True)
    try:
        pulls = PullSettings(
            [(backend, url) for backend, url in (("tempo", tempo), ("jaeger", jaeger)) if url],
            limit,
            lookback_seconds(lookback),
            timeout,
            round(max_mb * 1e6),
            read_limits(bounds),
        )
        _diff(before, after, output, json_path, fail_on_regression, pulls, console)
    except (typer.Exit, typer.BadParameter, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 - the contract: any other failure is exit 3, one line
        internal_error("diff", error, debug, console)


def _analysed(name: str, run: str, pulls: PullSettings, console: Console) -> tuple[Analysis, bool]:
    from vlmtrace.analysis.pipeline import analyze
    from vlmtrace.analysis.readers.remote import Query

    if os.path.exists(run) or not pulls.backends:
        paths, queries = [run], []
    else:
        ids = tuple(run.split(",")) if _TRACE_IDS.match(run) else ()
        query = None if ids else run
        paths = []
        queries = [
            (
                backend,
                Query(url, query, ids, pulls.limit, pulls.lookback_s, pulls.timeout_s, budget_bytes=pulls.budget_bytes),
            )
            for backend, url in pulls.backends
        ]
    console.print(f"[dim]{name}: {escaped(run)}[/]")
    data, bad_input = read_traces(paths, queries, console, pulls.bounds)
    with console.status(f"analysing the {name} run", spinner="dots"):
        return analyze(data), bad_input


def _diff(
    before: str,
    after: str,
    output: Path,
    json_path: Path | None,
    fail_on_regression: bool,
    pulls: PullSettings,
    console: Console,
) -> None:
    try:
        import orjson

        from vlmtrace.analysis.compare import compare, nothing_to_compare
        from vlmtrace.report.diff_html import write_diff
        from vlmtrace.report.diff_text import NO_FITS, comparison_table, verdict_line
    except ImportError as error:
        needs_report_extra("diff", error, console)
    refuse_to_overwrite([output, json_path], [run for run in (before, after) if os.path.exists(run)], console)
    first, bad_before = _analysed("before", before, pulls, console)
    second, bad_after = _analysed("after", after, pulls, console)
    empty = nothing_to_compare(first, second)
    if empty is not None:
        console.print(f"[red]{escaped(empty)}[/]; no comparison written")
        raise typer.Exit(EXIT_BAD_INPUT)
    comparison = compare(first, second)
    try:
        write_diff(comparison, output)
        if json_path is not None:
            replace_file(json_path, orjson.dumps(comparison.to_dict(), option=orjson.OPT_INDENT_2))
    except OSError as error:
        console.print(f"[red]cannot write the comparison[/]: {escaped(error)}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    terminal = new_console(soft_wrap=False)
    if comparison.changes:
        terminal.print(comparison_table(comparison))
    else:
        terminal.print(NO_FITS)
    for change in comparison.changes:
        if change.verdict != "unchanged":
            terminal.print(plain(verdict_line(change)), soft_wrap=True)
    console.print(f"page: {escaped(output)}" + (f", JSON: {escaped(json_path)}" if json_path else ""))
    if bad_before or bad_after:
        raise typer.Exit(EXIT_BAD_INPUT)
    if fail_on_regression and comparison.regressed:
        raise typer.Exit(EXIT_FLAGGED)
