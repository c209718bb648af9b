"""benchmarks/request_in_place.py on LMDeploy 0.18's real pipeline over the stand-in TurboMind engine:
the parts of vlmtrace's work it times are those a request does on the event loop, and the boundary
reads it compares all ran there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.benchmark_run import run_benchmark

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")


@pytest.mark.lmdeploy
def test_the_event_loop_parts_of_a_request_are_its_three_spans_and_their_readings_and_attributes(tmp_path: Path):
    result_path = tmp_path / "in-place.json"
    done = run_benchmark("request_in_place.py", "--seconds", "1", "--json", str(result_path), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(result_path.read_text())
    parts = result["parts"]["parts"]
    # The request, vision-preprocess and TurboMind stream spans start and end on the loop; the pipeline
    # span's run on the caller's thread and are not counted.
    assert parts["span starts"]["calls_per_request"] == 3
    assert parts["span ends"]["calls_per_request"] == 3
    assert parts["memory readings"]["calls_per_request"] >= 7  # six at span boundaries, one at the prompt's end
    assert parts["attributes: request_attributes"]["calls_per_request"] == 1
    assert parts["attributes: _vision_tokens"]["calls_per_request"] == 1
    assert parts["attributes (all)"]["us_per_request"] > 0
    reads = result["reads"]["reads"]
    assert set(reads) == {
        "compiled core (statm_rss)",
        "ctypes pread (without the core)",
        "os.pread",
        "clock only (vDSO)",
    }
    assert all(read["boundaries"] > 0 and read["cold_us"] > 0 for read in reads.values())
