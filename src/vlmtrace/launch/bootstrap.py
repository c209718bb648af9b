"""What `vlmtrace run`'s sitecustomize does in each Python process: instrument it once it imports lmdeploy
(and, with --otlp-endpoint, install an OpenTelemetry SDK exporting OTLP first)."""

from __future__ import annotations

import os
import sys
import types

from vlmtrace.launch import ENV_ACTIVE, ENV_CONFIGURE


def _instrument(module: types.ModuleType) -> None:
    import vlmtrace

    steps = [vlmtrace.instrument]
    if os.environ.get(ENV_CONFIGURE) == "otlp":  # --otlp-endpoint: this process's SDK first, unless it has one
        steps.insert(0, vlmtrace.configure)
    for step in steps:
        try:
            step()
        except Exception as error:  # noqa: BLE001 - a bootstrap problem must never stop the program
            sys.stderr.write(
                f"vlmtrace run: could not {step.__name__} process {os.getpid()}: {type(error).__name__}: {error}\n"
            )


def arm() -> None:
    """`vlmtrace.instrument()` right after `lmdeploy` has been imported, in this process only."""
    if os.environ.get(ENV_ACTIVE) != "1":
        return
    import wrapt

    wrapt.register_post_import_hook(_instrument, "lmdeploy")
