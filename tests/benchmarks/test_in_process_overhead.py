"""benchmarks/gpu_ablation.py (and with it gpu_overhead.py's measurement) end to end on a CPU, the stand-in
TurboMind engine under LMDeploy's real Python: what a device session runs must not fail there first.
Every arm reports the event-loop thread's CPU per batch, and the arms that take wrappers off read less."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_ablation.py"


def test_each_arm_reports_the_event_loops_cpu_and_unwrapping_a_role_takes_its_readings_off(tmp_path: Path):
    path = tmp_path / "ablation.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--backend",
            "turbomind",
            "--standin",
            "--rounds",
            "4",
            "--per-round",
            "2",
            "--resamples",
            "200",
            "--ablation",
            "unwrapped-request.preprocess",
            "--ablation",
            "sampler-only",
            "--ablation",
            "no-relay",
            "--ablation",
            "no-response-end",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=SCRIPT.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(path.read_text())

    arms = ("plain", "vlmtrace", "unwrapped-request.preprocess", "sampler-only", "no-relay", "no-response-end")
    assert all(result[arm]["event_loop_cpu_ms_per_batch"] > 0 for arm in arms)
    for arm in arms[1:]:
        added = result[arm]["event_loop_cpu_added_ms_per_batch"]
        for statistic in ("mean", "median"):
            low, high = added[f"{statistic}_interval_95"]
            assert low <= added[statistic] <= high
    # The request span, its engine stream and the prompt's end: each read memory; without the request's
    # wrapper none of them exists. Without any wrapper nothing is read on the request path.
    assert (
        0
        < result["unwrapped-request.preprocess"]["memory_reads_per_batch"]
        < result["vlmtrace"]["memory_reads_per_batch"]
    )
    assert result["sampler-only"]["memory_reads_per_batch"] == 0
