"""benchmarks/gpu_overhead_processes.py end to end on a CPU (the stand-in TurboMind engine under
LMDeploy's real Python): real child processes, pairs alternating their order, and `--resume`, which
lets the issue's eight pairs of a 2B model span two device commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_overhead_processes.py"


def _run(json_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--backend",
            "turbomind",
            "--standin",
            "--batches",
            "2",
            "--warmup",
            "0",
            "--json",
            str(json_path),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_run_resumed_adds_pairs_and_keeps_alternating(tmp_path: Path):
    path = tmp_path / "pairs.json"
    first = _run(path, "--pairs", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = _run(path, "--pairs", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads(path.read_text())
    assert [pair["index"] for pair in result["pairs"]] == [0, 1]
    assert [pair["order"] for pair in result["pairs"]] == [["plain", "vlmtrace"], ["vlmtrace", "plain"]]
    assert result["resumed"][0]["pairs"] == 1 and result["stopped"] is None
    assert result["summary"]["vlmtrace"]["pair_ratio"]["median"] > 0
    # each process read its event loop's CPU clock; each pair says what the instrumented one added
    assert all(
        process["event_loop_cpu_ms_per_batch"] > 0 for pair in result["pairs"] for process in pair["processes"].values()
    )
    assert "vlmtrace" in result["pairs"][1]["event_loop_cpu_added_ms"]
    assert "median" in result["summary"]["vlmtrace"]["event_loop_cpu_added_ms"]


def test_a_resume_with_other_settings_is_refused(tmp_path: Path):
    path = tmp_path / "pairs.json"
    assert _run(path, "--pairs", "1").returncode == 0
    before = path.read_text()
    other = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--backend",
            "turbomind",
            "--standin",
            "--batches",
            "3",
            "--warmup",
            "0",
            "--json",
            str(path),
            "--pairs",
            "2",
            "--resume",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert other.returncode == 2 and "other settings (batches)" in other.stderr
    assert path.read_text() == before  # the earlier pairs are untouched
    missing = subprocess.run(
        [sys.executable, str(SCRIPT), "--backend", "turbomind", "--standin", "--resume"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "--resume needs --json" in missing.stderr
