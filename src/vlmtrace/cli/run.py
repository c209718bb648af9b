"""`vlmtrace run` in the CLI's command list. The `vlmtrace` entry point (vlmtrace.__main__) hands `run`
to vlmtrace.launch before this app is built; a caller of the app itself gets the same parser."""

from __future__ import annotations

import typer

RUN_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def run(ctx: typer.Context) -> None:
    """Start a Python program, and every Python process it starts, instrumented:
    vlmtrace run [--journal PATH] [--otlp-endpoint URL] [--service-name NAME] [--heap-counter] [--] COMMAND ..."""
    from vlmtrace.launch import main

    raise typer.Exit(main(ctx.args))
