"""A benchmark script run as CI runs it: in a process of its own, with this interpreter, from the
repository's root, the package's src/ and the repository importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *arguments: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"},
    )
