"""The property-based tests (tests/analysis/test_properties.py) with the `long` hypothesis profile: 2,000
generated settled series per property and ~660 whole small journals, where CI runs a few dozen.

    PYTHONPATH=src python benchmarks/property_long.py [pytest options]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    environment = {**os.environ, "HYPOTHESIS_PROFILE": "long", "PYTHONPATH": str(ROOT / "src")}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        str(ROOT / "tests" / "analysis" / "test_properties.py"),
        *sys.argv[1:],
    ]
    sys.exit(subprocess.run(command, env=environment, cwd=ROOT, check=False).returncode)
