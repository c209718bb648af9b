"""`vlmtrace capture --pid PID`: open capture windows in a running, instrumented process.

It leaves a trigger file in the process's journal directory (vlmtrace/capture/controller.py); the
process's background sampler takes it at its next sample and opens the windows its tools allow. The
journal directory is the one the process has its journal open in (read from /proc/PID/fd), or --journal.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Annotated

import typer

from vlmtrace.capture.controller import trigger_path

EXIT_TAKEN, EXIT_NOT_TAKEN, EXIT_BAD_INPUT = 0, 1, 2
POLL_S = 0.05
_JOURNAL_FILE = re.compile(r"^vlmtrace-.*\.jsonl$")


def _open_journal_directory(pid: int) -> str | None:
    """The directory of a journal file the process holds open, if one can be seen."""
    folder = f"/proc/{pid}/fd"
    try:
        descriptors = os.listdir(folder)
    except OSError:
        return None
    for descriptor in descriptors:
        try:
            target = os.readlink(os.path.join(folder, descriptor))
        except OSError:
            continue
        if _JOURNAL_FILE.match(os.path.basename(target)) and os.path.isabs(target):
            return os.path.dirname(target)
    return None


def capture(
    pid: Annotated[int, typer.Option("--pid", metavar="PID", help="The instrumented process.", show_default=False)],
    journal: Annotated[
        str | None,
        typer.Option(
            "--journal", metavar="DIR", show_default=False, help="Its journal directory (default: the one it has open)."
        ),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            "--wait", metavar="SECONDS", min=0.1, help="How long to wait for the process to take the request."
        ),
    ] = 10.0,
) -> None:
    """Open capture windows in a running process instrumented by vlmtrace.

    The process records the allocation sites of what the windows keep into its journal (a `capture`
    record), which `vlmtrace report` reads. It needs the journal and the background sampler.

    \b
    Exit codes:
      0  the process took the request: its windows are open
      1  not taken within --wait seconds (not instrumented, capture off, sampler off, or busy)
      2  no such process, or no journal directory found or given
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        typer.echo(f"vlmtrace capture: no process {pid}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except PermissionError:
        pass  # another user's: its journal directory decides whether we may ask
    folder = journal if journal is not None else _open_journal_directory(pid)
    if folder is not None and os.path.isfile(folder):
        folder = os.path.dirname(os.path.abspath(folder))
    if folder is None or not os.path.isdir(folder):
        where = f"no journal directory at {folder}" if folder else f"found no journal open in process {pid}"
        typer.echo(f"vlmtrace capture: {where} (--journal DIR names it)", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    trigger = trigger_path(folder, pid)
    try:
        with open(trigger, "x"):
            pass
    except FileExistsError:
        pass  # asked already and not taken yet: wait for it as well
    except OSError as error:
        typer.echo(f"vlmtrace capture: cannot write {trigger} ({error.strerror or error})", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not os.path.exists(trigger):
            typer.echo(f"capture windows open in process {pid}; their allocation sites go to {folder} as each closes")
            return
        time.sleep(POLL_S)
    with contextlib.suppress(OSError):
        os.unlink(trigger)
    typer.echo(
        f"vlmtrace capture: process {pid} did not take the request within {wait:g} s (is it instrumented "
        "with capture on and sample_interval_ms above 0?)",
        err=True,
    )
    raise typer.Exit(EXIT_NOT_TAKEN)
