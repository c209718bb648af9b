"""benchmarks/gpu_profile.py on a CPU: `run --standin` drives the instrumented stand-in pipeline for py-spy to
sample, and `summarise` counts vlmtrace's own work per thread, leaving out what runs inside wrapped code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_profile.py"


def test_the_standin_run_times_its_batches():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--backend", "turbomind", "--seconds", "2", "--standin"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=SCRIPT.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert " batches, median " in done.stdout


def test_the_summary_counts_only_vlmtraces_own_frames(tmp_path: Path):
    loop = "thread (1): Thread-1;BaseEventLoop.run_forever (asyncio/base_events.py:608)"
    raw = tmp_path / "profile.raw"
    raw.write_text(
        "\n".join(
            [
                f"{loop};relay (vlmtrace/instrumentation/runtime.py:282);AsyncEngine.generate (lmdeploy/serve/core/async_engine.py:700) 40",
                f"{loop};relay (vlmtrace/instrumentation/runtime.py:282);MemoryProbe.read (vlmtrace/probes/memory.py:150) 7",
                f"{loop};EpollSelector.select (selectors.py:468) 50",
                "thread (2): vlmtrace-journal;RecordQueue._flush_regularly (vlmtrace/export/journal/batching.py:64) 3",
            ]
        )
        + "\n"
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "summarise", str(raw)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    loop_row = next(line for line in lines if line.startswith("Thread-1"))
    assert loop_row.split()[1:3] == [
        "97",
        "7",
    ]  # busy samples; ours: the probe's read, not the generator under the relay
    assert any("MemoryProbe.read probes/memory.py:150" in line for line in lines)
    assert not any("relay" in line for line in lines)
