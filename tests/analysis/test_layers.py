"""The analysis layer imports without the rendering libraries, and never imports torch or LMDeploy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PROBE = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"plotly", "jinja2", "torch", "lmdeploy"}:
            raise ImportError(f"{name} is not allowed here")

sys.meta_path.insert(0, Refuse())
import vlmtrace.analysis.pipeline, vlmtrace.analysis.readers.detect, vlmtrace.analysis.readers.remote
import vlmtrace.cli.main
print("ok")
"""


def test_analysis_imports_without_plotly_jinja2_torch_or_lmdeploy():
    done = subprocess.run([sys.executable, "-c", PROBE], env={"PYTHONPATH": str(SRC)}, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr
