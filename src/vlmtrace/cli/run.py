"""`vlmtrace run`: the CLI's door to vlmtrace.launch, which parses its own arguments (everything after
`run` belongs to it and to the command it starts)."""

from __future__ import annotations

import typer

RUN_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def run(ctx: typer.Context) -> None:
    """Start a Python program, and every Python process it starts, instrumented:
    vlmtrace run [--journal DIR] [--otlp-endpoint URL] [--service-name NAME] -- COMMAND ..."""
    from vlmtrace.launch import main

    raise typer.Exit(main(ctx.args))
