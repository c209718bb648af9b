"""`vlmtrace run -- COMMAND ...`: start any Python program instrumented, with every Python process it starts.

The program and its Python children (multiprocessing's spawn, subprocess) inherit a PYTHONPATH whose
first entry holds vlmtrace's `sitecustomize.py`. Python imports it at start; it chains to the
sitecustomize it hides and arranges for `vlmtrace.instrument()` to run as soon as the process imports
lmdeploy, so a helper process that never does (a resource tracker, a compiler) stays untouched.
Options travel as the usual VLMTRACE_* and OTEL_* variables; a journal directory gets one file per
process. The program replaces this process (`exec`): same pid, same signals.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from vlmtrace.config import is_off

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pythonpath")
ENV_ACTIVE = "VLMTRACE_RUN"  # "1" in every process started under `vlmtrace run`; "0" turns the bootstrap off
ENV_CONFIGURE = "VLMTRACE_RUN_CONFIGURE"  # "otlp": each process calls vlmtrace.configure() (--otlp-endpoint)
DEFAULT_JOURNAL = "vlmtrace-journal"

DESCRIPTION = """Start COMMAND (python -m ..., a console script such as `lmdeploy serve api_server ...`, a script)
with vlmtrace instrumenting every Python process of it that imports lmdeploy. Every other option comes
from the VLMTRACE_* and OTEL_* environment variables."""


def parser() -> argparse.ArgumentParser:
    """Options first; the command and everything after it (its own options included) are the command's."""
    arguments = argparse.ArgumentParser(prog="vlmtrace run", description=DESCRIPTION, allow_abbrev=False)
    arguments.add_argument(
        "--journal", metavar="PATH", help="journal directory (one file per process; default ./vlmtrace-journal), or off"
    )
    arguments.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export traces and metrics over OTLP to URL: each process installs an OpenTelemetry "
        "SDK (vlmtrace.configure(); needs vlmtrace[otlp]) unless it has one already",
    )
    arguments.add_argument(
        "--service-name", metavar="NAME", help="service.name of every process (sets OTEL_SERVICE_NAME)"
    )
    arguments.add_argument(
        "--heap-counter",
        action="store_true",
        help="preload vlmtrace's heap counter (built with the wheel), so "
        "host growth is placed in the stage that allocates it, not where pages are first touched "
        "(docs/analysis.md)",
    )
    arguments.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="[--] COMMAND [ARG ...]",
        help="the program to start, with its arguments",
    )
    return arguments


def environment(
    base: Mapping[str, str],
    journal: str | None = None,
    otlp_endpoint: str | None = None,
    service_name: str | None = None,
    heap_counter: str | None = None,
) -> dict[str, str]:
    """The environment the program runs in: the bootstrap first on PYTHONPATH, the options as variables,
    `heap_counter` (the library's path) first on LD_PRELOAD.

    The journal path is made absolute, so children that change directory write beside their parent."""
    env = dict(base)
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    env[ENV_ACTIVE] = "1"
    target = journal if journal is not None else env.get("VLMTRACE_JOURNAL") or DEFAULT_JOURNAL
    env["VLMTRACE_JOURNAL"] = "off" if is_off(target) else os.path.abspath(target)
    if otlp_endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
        env[ENV_CONFIGURE] = "otlp"
    if service_name:
        env["OTEL_SERVICE_NAME"] = service_name
    if heap_counter:
        others = [path for path in env.get("LD_PRELOAD", "").replace(":", " ").split() if path != heap_counter]
        env["LD_PRELOAD"] = " ".join([heap_counter, *others])
    return env


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The options and the command; argparse's exit (status 2 and the usage) for bad options or no command."""
    arguments = parser()
    parsed = arguments.parse_args(argv)
    if parsed.command[:1] == ["--"]:
        parsed.command = parsed.command[1:]
    if not parsed.command:
        arguments.error("a COMMAND to start is needed")
    return parsed


def build_torch_counters(env: Mapping[str, str]) -> None:
    """The compiled read of torch's counters (probes/native_counters.py) for the installed torch, built here
    before the program starts, once per torch installation, where the program's options read them: an
    instrumented process never runs a compiler. Where it cannot be built, the program reads them through
    Python (said on stderr)."""
    from vlmtrace.config import Options
    from vlmtrace.probes import native_counters

    options = Options.resolve(environ=env)
    torch_dir = native_counters.installed_torch_dir()
    if not options.native_counters or "torch" not in options.probes or torch_dir is None:
        return
    if native_counters.library_path(torch_dir).exists():
        return
    sys.stderr.write(
        "vlmtrace run: building the compiled read of torch's allocator counters for this torch (once, ~30 s)\n"
    )
    try:
        native_counters.build()
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        sys.stderr.write(f"vlmtrace run: torch's allocator counters are read through Python: {error}\n")


def main(argv: Sequence[str]) -> int:
    """Exec the command instrumented; returns only when it cannot be started."""
    try:
        parsed = parse(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2), already printed
        return exit_.code if isinstance(exit_.code, int) else 2
    heap_counter = None
    if parsed.heap_counter:
        from vlmtrace.probes.heap import HeapCounterUnavailable, library

        try:
            heap_counter = str(library())
        except HeapCounterUnavailable as error:
            sys.stderr.write(
                f"vlmtrace run: --heap-counter: {error} (run without --heap-counter to start the program without it)\n"
            )
            return 1
    env = environment(os.environ, parsed.journal, parsed.otlp_endpoint, parsed.service_name, heap_counter)
    build_torch_counters(env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(parsed.command[0], parsed.command, env)
    except FileNotFoundError:
        sys.stderr.write(f"vlmtrace run: {parsed.command[0]}: command not found\n")
        return 127  # what a shell returns
    except OSError as error:  # strerror only: the exception's text holds the path as a bytes literal
        sys.stderr.write(f"vlmtrace run: {parsed.command[0]}: {error.strerror or error}\n")
        return 126
    return 0  # not reached: exec replaced this process
