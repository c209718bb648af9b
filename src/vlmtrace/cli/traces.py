"""What the commands that analyse traces (`report`, `diff`) share: reading files and pulls with progress,
saying what was skipped, refusing to overwrite an input, and the exit codes CI relies on.

Exit codes (docs/configuration.md): 0 nothing to flag; 1 what the command was asked to fail on
(`report --fail-on-leak`, `diff --fail-on-regression`); 2 bad or empty input, or an output that would
overwrite an input; 3 internal error; 4 the report extra is not installed.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from vlmtrace.__main__ import EXIT_NO_EXTRA
from vlmtrace.report.terminal import escaped, plain

if TYPE_CHECKING:
    from rich.status import Status

    from vlmtrace.analysis.readers.budget import ReadLimits
    from vlmtrace.analysis.readers.remote import Query
    from vlmtrace.analysis.trace_data import TraceData

EXIT_FLAGGED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
PROGRESS_FROM_BYTES = 32 * 1024 * 1024
SHOWN_PROBLEMS = 20

# A pull (--tempo/--jaeger) reads every trace its search matches, unless --limit asks for a sample; one that
# a bound cut short is bad input (exit 2), its report saying how much was read.
MAX_MB = 2000.0
# The range of each numeric option (docs/configuration.md): outside it, or NaN or infinite, exit 2.
LIMIT_RANGE = (1, 10_000_000)
TIMEOUT_RANGE_S = (0.1, 86_400.0)
MAX_MB_RANGE = (0.001, 1e9)
LOOKBACK_RANGE_S = (1, 3650 * 86_400)


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else f"a {len(str(abs(value)))}-digit number"
    return str(int(value)) if value.is_integer() and abs(value) < 10**18 else f"{value:g}"


def within(least: float, most: float) -> Callable[[float | None], float | None]:
    """An option callback: refuse NaN, an infinity, or a value outside [least, most], saying so in words."""

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and least <= value <= most):
            raise typer.BadParameter(f"{_number(value)} is not between {_number(least)} and {_number(most)}")
        return value

    return check


# The pull options and the per-input bounds, declared once for `report` and `diff`.
Limit = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        callback=within(*LIMIT_RANGE),
        help=(
            "With --tempo or --jaeger, pull only the newest N traces of a search: a sample, said so in the report "
            "(default: every trace)."
        ),
    ),
]
Lookback = Annotated[
    str, typer.Option(metavar="DURATION", help="With --tempo or --jaeger, how far back a search looks (30m, 6h, 2d).")
]
Timeout = Annotated[
    float,
    typer.Option(
        metavar="SECONDS",
        callback=within(*TIMEOUT_RANGE_S),
        help="With --tempo or --jaeger, the longest one response may take.",
    ),
]
MaxMb = Annotated[
    float,
    typer.Option(
        "--max-mb",
        metavar="MB",
        callback=within(*MAX_MB_RANGE),
        help="With --tempo or --jaeger, the most megabytes a pull may download.",
    ),
]
Bounds = Annotated[
    list[str] | None,
    typer.Option(
        "--max",
        metavar="NAME=VALUE",
        help=(
            "Raise (or lower) a bound on what one input may cost, NAME=VALUE (repeatable): input-bytes (8G), "
            "record-bytes (64M), records (50M), spans (10M), processes (256), snapshot-blocks (2M), "
            "snapshot-frame-bytes (256M), cpu-seconds (300), expanded-bytes (gzip: 64x its size, at least 128M)."
        ),
    ),
]


def lookback_seconds(text: str) -> int:
    """Seconds from `30m`, `6h`, `2d` or a count of seconds; BadParameter outside LOOKBACK_RANGE_S."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise typer.BadParameter(f"{text!r} is not a duration like 30m, 6h or 2d", param_hint="--lookback") from None
    least, most = LOOKBACK_RANGE_S
    if not least <= seconds <= most:  # NaN too
        raise typer.BadParameter(f"{text!r} is not a duration from 1s to {most // 86_400}d", param_hint="--lookback")
    return int(seconds)


def internal_error(command: str, error: Exception, debug: bool, console: Console) -> None:
    """Any failure but bad input: one line (the traceback in a file, or printed with --debug), exit 3."""
    text = "".join(traceback.format_exception(error))
    summary = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    if debug:
        for line in text.splitlines():
            console.print(plain(line))
        console.print(f"[red]vlmtrace {command}: internal error[/] {escaped(summary)}")
    else:
        try:
            with tempfile.NamedTemporaryFile(
                "w", prefix=f"vlmtrace-{command}-", suffix=".traceback.txt", delete=False
            ) as handle:
                handle.write(text)
            where = f"traceback in {escaped(handle.name)}"
        except OSError as failure:  # a full disk: the one line is still said
            where = f"the traceback could not be written: {escaped(failure)}"
        console.print(
            f"[red]vlmtrace {command}: internal error[/] {escaped(summary)} "
            f"({where}; --debug prints it; please report it)"
        )
    raise typer.Exit(EXIT_INTERNAL)


def refuse_to_overwrite(outputs: list[Path | None], inputs: list[str], console: Console) -> None:
    """Exit 2 when an output is one of the input files (never overwrite a journal), or when the two
    outputs name one file (the JSON summary would replace the HTML page)."""
    from vlmtrace.analysis.readers.files import expand
    from vlmtrace.report.output import same_file

    named = [output for output in outputs if output is not None]
    if len(named) == 2 and same_file(*named):
        console.print(f"[red]refusing to write[/] {escaped(named[1])}: -o and --json name the same file")
        raise typer.Exit(EXIT_BAD_INPUT)
    files = expand(inputs)
    for output in named:
        for path in files:
            try:
                if os.path.exists(output) and os.path.samefile(output, path):
                    console.print(f"[red]refusing to write[/] {escaped(output)}: it is one of the inputs")
                    raise typer.Exit(EXIT_BAD_INPUT)
            except OSError:
                continue


def read_limits(settings: list[str] | None) -> ReadLimits:
    """The bounds each input is read within: defaults raised (or lowered) by `--max NAME=VALUE`; the
    analyzer's variables (docs/configuration.md) checked first. BadParameter (exit 2) naming what is wrong."""
    from vlmtrace.analysis.readers.budget import ReadLimits
    from vlmtrace.analysis.readers.parallel import processes_wanted

    try:
        limits = ReadLimits.from_environment()
        processes_wanted()
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    try:
        return limits.with_settings(settings or [])
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--max") from None


def _read_files(paths: list[str], console: Console, data: TraceData, limits: ReadLimits | None) -> None:
    from vlmtrace.analysis.readers.detect import read_inputs
    from vlmtrace.analysis.readers.files import expand

    total = sum(os.path.getsize(path) for path in expand(paths) if os.path.isfile(path))
    if total < PROGRESS_FROM_BYTES:
        read_inputs(paths, data=data, limits=limits)
        return
    columns = (TextColumn("reading traces"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    # Refreshed by hand, not by rich's thread: large journals are read by forked processes.
    with Progress(*columns, console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("read", total=total)

        def advance(done: int, _total: int) -> None:
            progress.update(task, completed=done)
            progress.refresh()

        read_inputs(paths, progress=advance, data=data, limits=limits)


def _arrow_gives_back_memory() -> None:
    """Arrow's own allocator (mimalloc) keeps what the analysis frees for later use; a report is one
    short process with one peak, and with the system allocator that memory goes back (at a million
    spans, 0.1 GB less at the peak, at no measured cost in time: docs/performance.md)."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _say_pulling(status: Status, text: str) -> None:
    status.update(f"pulling traces: {escaped(text)}")


def read_traces(
    paths: list[str], pulls: list[tuple[str, Query]], console: Console, limits: ReadLimits | None = None
) -> tuple[TraceData, bool]:
    """Everything that could be read from `paths` and the (backend, query) `pulls`, problems printed;
    and whether any input was bad (an error problem, or a pull a bound cut short). Exit 2 when nothing at
    all could be read."""
    from vlmtrace.analysis.readers.remote import pull_jaeger, pull_tempo
    from vlmtrace.analysis.trace_data import TraceData

    _arrow_gives_back_memory()
    data = TraceData()
    for backend, query in pulls:
        pull = pull_tempo if backend == "tempo" else pull_jaeger
        with console.status(f"pulling traces from {escaped(query.base_url)}") as status:
            pull(data, query, progress=functools.partial(_say_pulling, status))
    _read_files(paths, console, data, limits)
    cut_short = False
    for warning in data.warnings:
        if warning.get("kind") == "pull_incomplete":
            console.print(f"[red]{escaped(warning['message'])}[/] (exit {EXIT_BAD_INPUT}; --limit N asks for a sample)")
            cut_short = True
        elif warning.get("kind") == "pull_sample":
            console.print(f"[yellow]{escaped(warning['message'])}[/]")
    # A whole input's problem (a bound reached, a file left out) before those of single lines: it says what to raise.
    errors = sorted(
        (problem for problem in data.problems if problem.severity == "error"), key=lambda p: p.line is not None
    )
    for problem in errors[:SHOWN_PROBLEMS]:
        console.print(f"[yellow]skipped[/] {escaped(problem.describe())}")
    if len(errors) > SHOWN_PROBLEMS:
        console.print(f"… and {len(errors) - SHOWN_PROBLEMS} more problems (listed in the report and the JSON summary)")
    notes = [
        problem for problem in data.problems if problem.severity != "error" and problem.line is None
    ]  # a whole file left out
    for problem in notes[:SHOWN_PROBLEMS]:
        console.print(f"[dim]note: {escaped(problem.describe())}[/]")
    if len(notes) > SHOWN_PROBLEMS:
        console.print(
            f"[dim]… and {len(notes) - SHOWN_PROBLEMS} more notes (listed in the report and the JSON summary)[/]"
        )
    if not (data.spans.count or data.samples.count or data.in_flight or data.snapshots or data.fatal):
        console.print("Nothing to analyse: no spans, memory samples or snapshots were read; no report written.")
        raise typer.Exit(EXIT_BAD_INPUT)
    return data, bool(errors) or cut_short


def needs_report_extra(command: str, error: ImportError, console: Console) -> None:
    console.print(plain(f"vlmtrace {command} needs the report extra ({error}): pip install 'vlmtrace[report]'"))
    raise typer.Exit(EXIT_NO_EXTRA) from None


def refuse_options_without(ctx: typer.Context, needed: tuple[str, ...], options: tuple[str, ...]) -> None:
    """Exit 2 when one of `options` was given on the command line without any of the `needed` ones."""
    given = [name for name in options if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]
    if given and not any(ctx.params.get(name) for name in needed):
        flags = " or ".join(f"--{name.replace('_', '-')}" for name in needed)
        raise typer.BadParameter(f"it only applies with {flags}", ctx=ctx, param_hint=f"--{given[0].replace('_', '-')}")
