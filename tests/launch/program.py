"""A program for `vlmtrace run`: imports lmdeploy, starts a spawned child that imports it too, and a Python
subprocess that never does."""

import multiprocessing
import subprocess
import sys


def child() -> None:
    import lmdeploy  # noqa: F401 - the import is what instruments a process


if __name__ == "__main__":
    import lmdeploy  # noqa: F401

    from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor

    process = multiprocessing.get_context("spawn").Process(target=child)
    process.start()
    process.join()
    helper = subprocess.run(
        [sys.executable, "-c", "import sys; print('vlmtrace.instrumentation.instrumentor' in sys.modules)"],
        check=True,
        capture_output=True,
        text=True,
    )
    print(
        f"instrumented={LMDeployInstrumentor.session is not None} child_exit={process.exitcode} "
        f"helper_imported_vlmtrace_instrumentation={helper.stdout.strip()}"
    )
