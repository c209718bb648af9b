"""Journals written by vlmtrace's own writer, killed mid-span (tests/export/crash_child.py), read by the analyzer.

The writer maps the file's tail, so a process that dies leaves zero bytes after its last record and
faulthandler's text after them: the reader must take all of that as a crash, not as corrupt input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import analyse
from vlmtrace import semconv as sc
from vlmtrace.report.html import render_report

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "export" / "crash_child.py"
IN_FLIGHT = [sc.SPAN_PIPELINE_INFER, "chat tiny-vl", sc.SPAN_TURBOMIND_STREAM]

pytestmark = pytest.mark.skipif(not CHILD.exists(), reason="the journal writer's crash child is not in this checkout")


def _crash(mode: str, journal: Path) -> None:
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    environment.pop("PYTHONFAULTHANDLER", None)
    subprocess.run([sys.executable, str(CHILD), mode, str(journal)], env=environment, capture_output=True, timeout=120)


@pytest.mark.parametrize("mode", ["abort-in-thread", "rotate-abort"])
def test_a_journal_cut_by_abort_reads_as_a_crash(tmp_path: Path, mode: str):
    _crash(mode, tmp_path / "journal")
    analysis = analyse(tmp_path / "journal")
    summary = analysis.summary
    assert [p for p in summary.problems if p["severity"] == "error"] == []
    assert summary.crashed
    (crashed,) = summary.crash
    assert [step["name"] for step in max(crashed["chains"], key=len)] == IN_FLIGHT
    (fatal,) = crashed["fatal"]
    assert fatal["title"] == "Fatal Python error: Aborted"
    assert any("crash_child.py" in frame for thread in fatal["threads"] for frame in thread["frames"])
    assert crashed["last_samples"], "the sample written just before the abort"
    page = render_report(analysis)
    assert "Fatal Python error: Aborted" in page and "lmdeploy.turbomind.stream" in page
