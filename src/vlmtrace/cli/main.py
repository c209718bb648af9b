"""The `vlmtrace` command: creates the app and registers its commands, with one help style for all
(`-h`/`--help` everywhere; plain text that wraps to the terminal, printed as written, so that
`pip install 'vlmtrace[report]'` keeps its brackets; metavars instead of Python type names)."""

from __future__ import annotations

from typing import Annotated

import typer

from vlmtrace import __version__
from vlmtrace.cli.capture import capture
from vlmtrace.cli.diff import diff
from vlmtrace.cli.doctor import doctor
from vlmtrace.cli.report import report
from vlmtrace.cli.run import RUN_SETTINGS, run
from vlmtrace.cli.top import top

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    help="Memory-aware tracing for vision-language models served with LMDeploy.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain text: no markup to eat brackets, the same look with or without rich
    context_settings=HELP_OPTIONS,
)


def _print_version(value: bool) -> None:
    if value:
        print(f"vlmtrace {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            metavar="",
            is_eager=True,
            callback=_print_version,
            help="Print vlmtrace's version and exit.",
        ),
    ] = False,
) -> None:
    """Memory-aware tracing for vision-language models served with LMDeploy."""


app.command("report", short_help="Analyse traces for memory growth and crashes; write an HTML report.")(report)
app.command("diff", short_help="Compare the memory growth of two runs, per component.")(diff)
app.command("top", short_help="Follow a journal while the service runs.")(top)
app.command("capture", short_help="Capture allocation sites in a running, instrumented process.")(capture)
app.command("doctor", short_help="Show what vlmtrace would see and hook in this environment.")(doctor)
app.command(
    "run",
    short_help="Start a program, and the Python processes it starts, instrumented.",
    context_settings={**HELP_OPTIONS, **RUN_SETTINGS},
)(run)
