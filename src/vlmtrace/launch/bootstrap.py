"""What `vlmtrace run`'s sitecustomize does in each Python process: instrument it once it imports lmdeploy."""

from __future__ import annotations

import os
import sys

from vlmtrace.launch import ENV_ACTIVE


def _instrument(module) -> None:
    try:
        import vlmtrace

        vlmtrace.instrument()
    except Exception as error:  # noqa: BLE001 - a bootstrap problem must never stop the program
        sys.stderr.write(f"vlmtrace run: could not instrument process {os.getpid()}: "
                         f"{type(error).__name__}: {error}\n")


def arm() -> None:
    """`vlmtrace.instrument()` right after `lmdeploy` has been imported, in this process only."""
    if os.environ.get(ENV_ACTIVE) != "1":
        return
    import wrapt

    wrapt.register_post_import_hook(_instrument, "lmdeploy")
