"""The `vlmtrace` command: creates the app and registers its commands."""

from __future__ import annotations

import typer

from vlmtrace.cli.diff import diff
from vlmtrace.cli.doctor import doctor
from vlmtrace.cli.report import report
from vlmtrace.cli.run import RUN_SETTINGS, run
from vlmtrace.cli.top import top

app = typer.Typer(help="Memory-aware tracing for vision-language models served with LMDeploy.", no_args_is_help=True, add_completion=False)


@app.callback()
def main() -> None:
    """Memory-aware tracing for vision-language models served with LMDeploy."""


app.command("report")(report)
app.command("diff")(diff)
app.command("top")(top)
app.command("doctor")(doctor)
app.command("run", context_settings=RUN_SETTINGS, add_help_option=False)(run)
