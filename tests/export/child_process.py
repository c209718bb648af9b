"""Running Python child processes that import this checkout's vlmtrace."""

from __future__ import annotations

import os
import subprocess
import sys

import vlmtrace

SRC = os.path.dirname(os.path.dirname(os.path.abspath(vlmtrace.__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    env.pop("PYTHONFAULTHANDLER", None)
    env.update(extra)
    return env


def start_python(*args: str, **extra_env: str) -> subprocess.Popen[str]:
    """Start `python ARGS...` with stdout piped as text."""
    return subprocess.Popen(
        [sys.executable, *args],
        env=child_env(**extra_env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
