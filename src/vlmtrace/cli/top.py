"""`vlmtrace top`: a live terminal view of a journal directory while the service writes it.

Read-only and in a process of its own: the service pays nothing for it (analysis/follow.py says how
files are read). `--once` prints one frame and exits, for scripts and tests.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live

from vlmtrace.cli.traces import (
    EXIT_BAD_INPUT,
    internal_error,
    needs_report_extra,
    within,
)
from vlmtrace.report.terminal import escaped, new_console

ONCE_WIDTH = 160
INTERVAL_RANGE_S = (0.1, 3600.0)
WINDOW_RANGE = (5, 100_000)  # requests kept per process


def top(
    journal: Annotated[str, typer.Argument(metavar="JOURNAL", hidden=True, show_default=False)] = "vlmtrace-journal",
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    interval: Annotated[
        float,
        typer.Option(
            metavar="SECONDS", callback=within(*INTERVAL_RANGE_S), help="Seconds between refreshes, from 0.1 to 3600."
        ),
    ] = 1.0,
    window: Annotated[
        int,
        typer.Option(
            metavar="N",
            callback=within(*WINDOW_RANGE),
            help="Requests the growth per request is fitted over, from 5 to 100000.",
        ),
    ] = 100,
    debug: Annotated[bool, typer.Option("--debug", help="On an internal error, print the traceback.")] = False,
) -> None:
    """Follow a journal while the service runs.

    JOURNAL is the directory (or file) the service writes, ./vlmtrace-journal by default. Shown: memory
    per device and component, growth per request over the last N requests with its verdict, requests to
    out-of-memory, what is in flight, and the last crash.

    \b
    Exit codes:
      0  stopped with Ctrl-C, or after --once
      2  an option out of its range, or the journal does not exist, is
         compressed (a finished journal: `vlmtrace report` reads it), or
         (with --once) holds no record
      3  internal error: the traceback is written to a file (--debug prints it)
      4  the report extra is not installed: pip install 'vlmtrace[report]'
    """
    console = new_console(stderr=True, soft_wrap=True)
    try:
        _top(journal, once, interval, window, console)
    except (typer.Exit, typer.BadParameter):
        raise
    except KeyboardInterrupt:
        return
    except Exception as error:  # noqa: BLE001 - the contract: any other failure is exit 3, one line
        internal_error("top", error, debug, console)


def _top(journal: str, once: bool, interval: float, window: int, console: Console) -> None:
    try:
        from vlmtrace.analysis.follow import JournalFollower
        from vlmtrace.analysis.live import live_view
        from vlmtrace.report.top_view import render
    except ImportError as error:
        needs_report_extra("top", error, console)
    if not os.path.exists(journal):
        console.print(f"no journal at {escaped(journal)} (give the directory the service writes: VLMTRACE_JOURNAL)")
        raise typer.Exit(EXIT_BAD_INPUT)
    if os.path.isfile(journal) and journal.endswith(".gz"):  # a finished journal, compressed: nothing will be appended
        console.print(
            f"{escaped(journal)} is a compressed journal: `vlmtrace top` follows the .jsonl files a running "
            f"service writes; `vlmtrace report {escaped(journal)}` reads this one"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    follower = JournalFollower(journal, window=window)
    follower.poll()
    if once:
        view = live_view(follower)
        # Piped into a file or a script, a frame is not cut to 80 columns.
        new_console(soft_wrap=False, width=None if sys.stdout.isatty() else ONCE_WIDTH).print(render(view))
        if not view.running and not view.ended:
            raise typer.Exit(EXIT_BAD_INPUT)
        return
    with Live(render(live_view(follower)), console=new_console(), auto_refresh=False, screen=False) as live:
        while True:
            time.sleep(interval)  # the refresh period of a view, not a synchronisation
            follower.poll()
            live.update(render(live_view(follower)), refresh=True)
