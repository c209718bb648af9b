"""`vlmtrace report`: traces in, an HTML report and a JSON summary out, and an exit code for CI.

The analysis libraries are imported when the command runs, so the rest of the CLI works without them.

Exit codes are a contract CI relies on: `report`'s help lists them, docs/analysis.md explains them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

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
    from rich.console import Console

    from vlmtrace.analysis.readers.budget import ReadLimits


def report(
    ctx: typer.Context,
    inputs: Annotated[list[str] | None, typer.Argument(metavar="INPUT", hidden=True, show_default=False)] = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", metavar="PATH", help="Where to write the HTML report.")
    ] = Path("vlmtrace-report.html"),
    json_path: Annotated[
        Path | None, typer.Option("--json", metavar="PATH", help="Also write the JSON summary here.")
    ] = None,
    fail_on_leak: Annotated[
        bool, typer.Option("--fail-on-leak", help="Exit with 1 when memory growth is found.")
    ] = False,
    tempo: Annotated[str | None, typer.Option(metavar="URL", help="Pull traces from this Tempo base URL.")] = None,
    jaeger: Annotated[
        str | None, typer.Option(metavar="URL", help="Pull traces from this Jaeger query base URL.")
    ] = None,
    query: Annotated[
        str | None, typer.Option(metavar="TEXT", help="With --tempo, a TraceQL query; with --jaeger, the service name.")
    ] = None,
    trace_id: Annotated[
        list[str] | None,
        typer.Option("--trace-id", metavar="ID", help="With --tempo or --jaeger, pull this trace (repeatable)."),
    ] = None,
    limit: Limit = None,
    lookback: Lookback = "1h",
    timeout: Timeout = 60.0,
    max_mb: MaxMb = MAX_MB,
    bounds: Bounds = None,
    debug: Annotated[bool, typer.Option("--debug", help="On an internal error, print the traceback.")] = False,
) -> None:
    """Analyse traces for memory growth and crashes; write an HTML report.

    Each INPUT is a journal file or directory, or an OTLP, Jaeger or Tempo JSON file (gzip is fine). With
    --tempo or --jaeger, the traces are pulled instead, or as well.

    \b
    Exit codes:
      0  no memory growth found (or found, without --fail-on-leak)
      1  memory growth found, with --fail-on-leak
      2  bad or empty input: the report covers what could be read, and none
         is written when nothing could; an option or VLMTRACE_REPORT_*
         variable out of its range; or an output that is an input
      3  internal error: the traceback is written to a file (--debug prints it)
      4  the report extra is not installed: pip install 'vlmtrace[report]'
    """
    refuse_options_without(ctx, ("tempo", "jaeger"), ("query", "trace_id", "limit", "lookback", "timeout", "max_mb"))
    console = new_console(stderr=True, soft_wrap=True)  # paths and messages stay on one line, for people and grep
    try:
        _report(
            inputs,
            output,
            json_path,
            fail_on_leak,
            tempo,
            jaeger,
            query,
            trace_id,
            limit,
            lookback,
            timeout,
            max_mb,
            read_limits(bounds),
            console,
        )
    except (typer.Exit, typer.BadParameter, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 - the contract: any other failure is exit 3, one line
        internal_error("report", error, debug, console)


def _report(
    inputs: list[str] | None,
    output: Path,
    json_path: Path | None,
    fail_on_leak: bool,
    tempo: str | None,
    jaeger: str | None,
    query: str | None,
    trace_id: list[str] | None,
    limit: int | None,
    lookback: str,
    timeout: float,
    max_mb: float,
    limits: ReadLimits,
    console: Console,
) -> None:
    try:
        from vlmtrace.analysis.pipeline import analyze
        from vlmtrace.analysis.readers.remote import Query
        from vlmtrace.analysis.wording import headline
        from vlmtrace.report.html import write_report
    except ImportError as error:
        needs_report_extra("report", error, console)
    paths = list(inputs or [])
    if not paths and not tempo and not jaeger:
        console.print("No input: name journal or trace files, or pull with --tempo/--jaeger URL.")
        raise typer.Exit(EXIT_BAD_INPUT)
    refuse_to_overwrite([output, json_path], paths, console)
    pulls = [
        (
            backend,
            Query(
                base_url,
                query,
                tuple(trace_id or ()),
                limit,
                lookback_seconds(lookback),
                timeout,
                budget_bytes=round(max_mb * 1e6),
            ),
        )
        for backend, base_url in (("tempo", tempo), ("jaeger", jaeger))
        if base_url
    ]
    data, bad_input = read_traces(paths, pulls, console, limits)
    with console.status("analysing", spinner="dots") as status:
        analysis = analyze(data, step=lambda text: status.update(f"analysing: {text}"))
        status.update("writing the report")
        try:
            write_report(analysis, output)
            if json_path is not None:
                replace_file(json_path, analysis.summary.to_json())
        except OSError as error:
            console.print(f"[red]cannot write the report[/]: {escaped(error)}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
    for line in headline(analysis.summary):
        console.print(plain(line))
    console.print(f"report: {escaped(output)}" + (f", summary: {escaped(json_path)}" if json_path else ""))
    if bad_input:
        raise typer.Exit(EXIT_BAD_INPUT)
    if fail_on_leak and analysis.summary.leak_found:
        raise typer.Exit(EXIT_FLAGGED)
