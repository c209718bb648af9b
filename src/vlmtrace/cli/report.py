"""`vlmtrace report`: traces in, an HTML report and a JSON summary out, and an exit code for CI.

The analysis libraries are imported when the command runs, so the rest of the CLI works without them.

Exit codes are a contract CI relies on: `report`'s help lists them, docs/analysis.md explains them.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from vlmtrace.analysis.trace_data import TraceData

EXIT_LEAK = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
PROGRESS_FROM_BYTES = 32 * 1024 * 1024
SHOWN_PROBLEMS = 20


def _lookback_seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)
    except (ValueError, IndexError):
        raise typer.BadParameter(f"{text!r} is not a duration like 30m, 6h or 2d") from None


def _arrow_gives_back_memory() -> None:
    """Arrow's own allocator (mimalloc) keeps what the analysis frees for later use; a report is one
    short process with one peak, and with the system allocator that memory goes back (at a million
    spans, 0.1 GB less at the peak, at no measured cost in time: docs/benchmarks.md, "Analyzer")."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _read(paths: list[str], console: Console, data: TraceData) -> None:
    from vlmtrace.analysis.readers.detect import read_inputs
    from vlmtrace.analysis.readers.files import expand

    total = sum(os.path.getsize(path) for path in expand(paths) if os.path.isfile(path))
    if total < PROGRESS_FROM_BYTES:
        read_inputs(paths, data=data)
        return
    columns = (TextColumn("reading traces"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    # Refreshed by hand, not by rich's thread: large journals are read by forked processes.
    with Progress(*columns, console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("read", total=total)

        def advance(done: int, _total: int) -> None:
            progress.update(task, completed=done)
            progress.refresh()

        read_inputs(paths, progress=advance, data=data)


def report(
    inputs: Annotated[
        list[str] | None,
        typer.Argument(help="Journal files or directories; OTLP, Jaeger or Tempo JSON files (gzip is fine)."),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the HTML report.")] = Path("vlmtrace-report.html"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON summary here.")] = None,
    fail_on_leak: Annotated[bool, typer.Option("--fail-on-leak", help="Exit with 1 when memory growth is found.")] = False,
    tempo: Annotated[str | None, typer.Option(help="Pull traces from this Tempo base URL.")] = None,
    jaeger: Annotated[str | None, typer.Option(help="Pull traces from this Jaeger query base URL.")] = None,
    query: Annotated[str | None, typer.Option(help="TraceQL for --tempo; the service name for --jaeger.")] = None,
    trace_id: Annotated[list[str] | None, typer.Option("--trace-id", help="Pull these traces by id (repeatable).")] = None,
    limit: Annotated[int, typer.Option(help="Most traces to pull from a search.")] = 20,
    lookback: Annotated[str, typer.Option(help="How far back a search looks (30m, 6h, 2d).")] = "1h",
    timeout: Annotated[float, typer.Option(help="Most seconds one response of --tempo/--jaeger may take.")] = 60.0,
    debug: Annotated[bool, typer.Option("--debug", help="On an internal error, print the traceback.")] = False,
) -> None:
    """Analyse traces for memory growth and crashes; write an HTML report (and a JSON summary).

    Exit codes: 0 no memory growth found (or --fail-on-leak not given); 1 growth found with
    --fail-on-leak; 2 bad or empty input (the report covers what could be read; none is written when
    nothing could), or an output that would overwrite an input; 3 internal error (the traceback is
    written to a file, or printed with --debug).
    """
    console = Console(stderr=True, soft_wrap=True)  # paths and messages stay on one line, for people and grep
    try:
        _report(inputs, output, json_path, fail_on_leak, tempo, jaeger, query, trace_id, limit, lookback, timeout, console)
    except (typer.Exit, typer.BadParameter, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 - the contract: any other failure is exit 3, one line
        _internal_error(error, debug, console)


def _internal_error(error: Exception, debug: bool, console: Console) -> None:
    text = "".join(traceback.format_exception(error))
    summary = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    if debug:
        console.print(escape(text), end="")
        console.print(f"[red]vlmtrace report: internal error[/] {escape(summary)}")
    else:
        with tempfile.NamedTemporaryFile("w", prefix="vlmtrace-report-", suffix=".traceback.txt", delete=False) as handle:
            handle.write(text)
        console.print(
            f"[red]vlmtrace report: internal error[/] {escape(summary)} "
            f"(traceback in {escape(handle.name)}; --debug prints it; please report it)"
        )
    raise typer.Exit(EXIT_INTERNAL)


def _overwrites_input(outputs: list[Path], files: list[str]) -> Path | None:
    """The first output that is one of the input files (never overwrite a journal)."""
    for output in outputs:
        for path in files:
            try:
                if os.path.exists(output) and os.path.samefile(output, path):
                    return output
            except OSError:
                continue
    return None


def _report(
    inputs: list[str] | None,
    output: Path,
    json_path: Path | None,
    fail_on_leak: bool,
    tempo: str | None,
    jaeger: str | None,
    query: str | None,
    trace_id: list[str] | None,
    limit: int,
    lookback: str,
    timeout: float,
    console: Console,
) -> None:
    try:
        from vlmtrace.analysis.analyze import analyze
        from vlmtrace.analysis.readers.remote import Query, pull_jaeger, pull_tempo
        from vlmtrace.analysis.trace_data import TraceData
        from vlmtrace.analysis.wording import headline
        from vlmtrace.report.html import write_report
    except ImportError as error:
        console.print(f"vlmtrace report needs the report extra ({escape(str(error))}): pip install 'vlmtrace[report]'")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    paths = list(inputs or [])
    if not paths and not tempo and not jaeger:
        console.print("No input: name journal or trace files, or pull with --tempo/--jaeger URL.")
        raise typer.Exit(EXIT_BAD_INPUT)
    from vlmtrace.analysis.readers.files import expand

    victim = _overwrites_input([output, *([json_path] if json_path else [])], expand(paths))
    if victim is not None:
        console.print(f"[red]refusing to write[/] {escape(str(victim))}: it is one of the inputs")
        raise typer.Exit(EXIT_BAD_INPUT)
    _arrow_gives_back_memory()
    data = TraceData()
    for base_url, pull in ((tempo, pull_tempo), (jaeger, pull_jaeger)):
        if base_url:
            with console.status(f"pulling traces from {escape(base_url)}") as status:
                pull(data, Query(base_url, query, tuple(trace_id or ()), limit, _lookback_seconds(lookback), timeout),
                     progress=lambda text, status=status: status.update(f"pulling traces: {escape(text)}"))
    _read(paths, console, data)
    errors = [problem for problem in data.problems if problem.severity == "error"]
    for problem in errors[:SHOWN_PROBLEMS]:
        console.print(f"[yellow]skipped[/] {escape(problem.describe())}")
    if len(errors) > SHOWN_PROBLEMS:
        console.print(f"… and {len(errors) - SHOWN_PROBLEMS} more problems (listed in the report and the JSON summary)")
    for problem in data.problems:
        if problem.severity != "error" and problem.line is None:  # a whole file left out on purpose: one line
            console.print(f"[dim]note: {escape(problem.describe())}[/]")
    if not (data.spans.count or data.samples.count or data.in_flight or data.snapshots or data.fatal):
        console.print("Nothing to analyse: no spans, memory samples or snapshots were read; no report written.")
        raise typer.Exit(EXIT_BAD_INPUT)
    with console.status("analysing", spinner="dots") as status:
        analysis = analyze(data, step=lambda text: status.update(f"analysing: {text}"))
        status.update("writing the report")
        try:
            write_report(analysis, output)
            if json_path is not None:
                json_path.write_bytes(analysis.summary.to_json())
        except OSError as error:
            console.print(f"[red]cannot write the report[/]: {escape(str(error))}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
    for line in headline(analysis.summary):
        console.print(escape(line))
    console.print(f"report: {escape(str(output))}" + (f", summary: {escape(str(json_path))}" if json_path else ""))
    if errors:
        raise typer.Exit(EXIT_BAD_INPUT)
    if fail_on_leak and analysis.summary.leak_found:
        raise typer.Exit(EXIT_LEAK)
