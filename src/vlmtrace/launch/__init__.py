"""`vlmtrace run -- COMMAND ...`: start any Python program instrumented, with every Python process it starts.

The program and its Python children (multiprocessing's spawn, subprocess) inherit a PYTHONPATH whose
first entry holds vlmtrace's `sitecustomize.py`. Python imports it at start; it chains to the
sitecustomize it hides and arranges for `vlmtrace.instrument()` to run as soon as the process imports
lmdeploy, so a helper process that never does (a resource tracker, a compiler) stays untouched.
Options travel as the usual VLMTRACE_* and OTEL_* variables; a journal directory gets one file per
process. The program replaces this process (`exec`): same pid, same signals.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pythonpath")
ENV_ACTIVE = "VLMTRACE_RUN"  # "1" in every process started under `vlmtrace run`; "0" turns the bootstrap off
DEFAULT_JOURNAL = "vlmtrace-journal"

USAGE = """usage: vlmtrace run [--journal PATH] [--otlp-endpoint URL] [--service-name NAME] [--] COMMAND [ARG ...]

Start COMMAND (python -m ..., a console script such as `lmdeploy serve api_server ...`, a script) with
vlmtrace instrumenting every Python process of it that imports lmdeploy. Every other option comes from
the VLMTRACE_* and OTEL_* environment variables (see README.md).

  --journal PATH         journal directory (one file per process; default ./vlmtrace-journal), or off
  --otlp-endpoint URL    OTLP endpoint for traces and metrics (sets OTEL_EXPORTER_OTLP_ENDPOINT)
  --service-name NAME    service.name of every process (sets OTEL_SERVICE_NAME)
"""

_OPTIONS = {"--journal": "journal", "--otlp-endpoint": "otlp_endpoint", "--service-name": "service_name"}


def environment(base: Mapping[str, str], journal: str | None = None, otlp_endpoint: str | None = None,
                service_name: str | None = None) -> dict[str, str]:
    """The environment the program runs in: the bootstrap first on PYTHONPATH, the options as variables.

    The journal path is made absolute, so children that change directory write beside their parent."""
    env = dict(base)
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    env[ENV_ACTIVE] = "1"
    target = journal if journal is not None else env.get("VLMTRACE_JOURNAL", DEFAULT_JOURNAL)
    off = target.strip().lower() in ("off", "false", "0", "no")
    env["VLMTRACE_JOURNAL"] = "off" if off else os.path.abspath(target)
    if otlp_endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
    if service_name:
        env["OTEL_SERVICE_NAME"] = service_name
    return env


def parse(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(options, command): options come first, then an optional `--`, then the command."""
    options: dict[str, str] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            index += 1
            break
        name, equals, value = arg.partition("=")
        if name not in _OPTIONS:
            if arg.startswith("-") and arg not in ("-h", "--help"):
                raise ValueError(f"unknown option {arg} (put the command after --)")
            break
        if not equals:
            index += 1
            if index == len(argv):
                raise ValueError(f"{arg} needs a value")
            value = argv[index]
        options[_OPTIONS[name]] = value
        index += 1
    return options, list(argv[index:])


def main(argv: Sequence[str]) -> int:
    """Exec the command instrumented; returns only when it cannot be started."""
    try:
        options, command = parse(argv)
    except ValueError as error:
        sys.stderr.write(f"vlmtrace run: {error}\n{USAGE}")
        return 2
    if not command or command[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if command else 2
    env = environment(os.environ, **options)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        sys.stderr.write(f"vlmtrace run: {command[0]}: command not found\n")
        return 127  # what a shell returns
    except OSError as error:  # strerror only: the exception's text holds the path as a bytes literal
        sys.stderr.write(f"vlmtrace run: {command[0]}: {error.strerror or error}\n")
        return 126
    return 0  # not reached: exec replaced this process
