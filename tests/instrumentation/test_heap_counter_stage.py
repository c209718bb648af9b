"""The heap counter as host growth's second witness (`vlmtrace run --heap-counter`): on LMDeploy 0.18's real
pipeline (stand-in TurboMind on the CPU, one prompt in flight), prompt processing keeps a buffer whose
pages the vision encoder's preprocessing first writes (heap_child.py). Resident pages rise in vision
preprocessing, a stage named wrong by RSS alone; the heap's bytes in use rise in prompt processing. Two
witnesses that name different stages name none, and say both (docs/analysis.md, "The heap counter")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlmtrace import semconv as sc
from vlmtrace.analysis.analyze import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.probes import heap

MiB = 1 << 20
REQUESTS = 120  # heap_child.py's
CHILD = Path(__file__).with_name("heap_child.py")


def _host_verdict(tmp_path: Path, preload: str | None):
    journal = tmp_path / ("counted" if preload else "resident")
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run([sys.executable, str(CHILD), str(journal)], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (host,) = [v for v in analyze(read_inputs([str(journal)])).summary.verdicts if v.component == "host"]
    assert host.klass == "host_growth" and host.slope_bytes_per_request == pytest.approx(MiB, rel=0.1), host
    return host


@pytest.mark.lmdeploy
def test_where_pages_and_the_heap_disagree_neither_stage_is_named(tmp_path, monkeypatch):
    if heap.find_compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path / "cache"))
    resident = _host_verdict(tmp_path, None)
    assert resident.stage == sc.STAGE_VISION_PREPROCESS and "heap_stage" not in resident.evidence  # RSS alone: wrong

    counted = _host_verdict(tmp_path, str(heap.build()))
    assert counted.evidence["heap_stage"] == sc.STAGE_PROMPT
    assert counted.evidence["heap_retained_by_stage"][sc.STAGE_PROMPT] > 0.9 * REQUESTS * MiB
    assert counted.stage is None
    assert counted.evidence["stage_uncertain"].startswith(
        f"resident pages rose in {sc.STAGE_VISION_PREPROCESS}, the heap's bytes in use in {sc.STAGE_PROMPT}")
