"""`vlmtrace run` in the CLI's command list, with the same help as the other commands. The `vlmtrace` entry
point (vlmtrace.__main__) hands `run` to vlmtrace.launch before this app is built, so that it works where
the CLI's libraries (typer, rich) are not installed; it comes here for `run -h`, and a caller of the app
itself gets the same options."""

from __future__ import annotations

from typing import Annotated

import typer

# Options first; the first word that is not an option starts the command, whose own options stay its own.
RUN_SETTINGS = {"allow_interspersed_args": False}


def run(
    command: Annotated[list[str] | None, typer.Argument(metavar="COMMAND", hidden=True, show_default=False)] = None,
    journal: Annotated[
        str | None,
        typer.Option(
            metavar="PATH",
            show_default=False,
            help="Journal directory (one file per process; default ./vlmtrace-journal), or off.",
        ),
    ] = None,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            show_default=False,
            help="Export traces and metrics over OTLP to URL: each process installs an OpenTelemetry SDK "
            "(vlmtrace.configure(); needs vlmtrace[otlp]) unless it has one already.",
        ),
    ] = None,
    service_name: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", show_default=False, help="service.name of every process (sets OTEL_SERVICE_NAME)."
        ),
    ] = None,
    heap_counter: Annotated[
        bool,
        typer.Option(
            "--heap-counter",
            metavar="",
            help="Preload vlmtrace's heap counter (built with the wheel), so that host "
            "growth is placed in the stage that allocates it, not where its pages are first touched.",
        ),
    ] = False,
) -> None:
    """Start a program, and the Python processes it starts, instrumented.

    COMMAND [ARG]... (after --, where its own options could be taken for these) is `python -m ...`, a console
    script such as `lmdeploy serve api_server ...`, or a script.
    vlmtrace instruments every Python process of it that imports LMDeploy, each writing its own journal
    file. Other settings come from the VLMTRACE_* and OTEL_* environment variables. It needs only
    vlmtrace's base install.

    \b
    Exit codes:
      the program's own: it replaces this process (same pid)
      1    --heap-counter's library cannot be built or loaded
      2    bad options, or no command
      126  the command cannot be executed
      127  the command is not found
    """
    from vlmtrace.launch import main

    options = [
        *(["--journal", journal] if journal is not None else []),
        *(["--otlp-endpoint", otlp_endpoint] if otlp_endpoint is not None else []),
        *(["--service-name", service_name] if service_name is not None else []),
        *(["--heap-counter"] if heap_counter else []),
    ]
    raise typer.Exit(main([*options, "--", *(command or [])]))
