"""The CPU api_server (tests/support/cpu_api_server.py) with one more way to end: SIGUSR1 makes the main
thread call `sys.exit(0)`, the way a service's own code ends itself.

    python -m tests.serving.exit_on_sigusr1 serve api_server MODEL --backend pytorch ...
"""

import runpy
import signal
import sys


def _exit(signum, frame) -> None:
    sys.exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _exit)
    runpy.run_module("tests.support.cpu_api_server", run_name="__main__", alter_sys=True)
