"""Host growth placed where the memory is kept, with the heap counter preloaded (`vlmtrace run
--heap-counter`): on LMDeploy 0.18's real pipeline (stand-in TurboMind on the CPU), prompt processing
keeps a buffer whose pages the vision encoder's preprocessing first writes (heap_child.py). Resident
pages rise in vision preprocessing; the heap counter rises in prompt processing, where the leak is."""

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
CHILD = Path(__file__).with_name("heap_child.py")


def _host_verdict(tmp_path: Path, preload: str | None):
    journal = tmp_path / ("counted" if preload else "resident")
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run([sys.executable, str(CHILD), str(journal)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (host,) = [v for v in analyze(read_inputs([str(journal)])).summary.verdicts if v.component == "host"]
    assert host.klass == "host_growth" and host.slope_bytes_per_request == pytest.approx(MiB, rel=0.1), host
    return host


@pytest.mark.lmdeploy
def test_the_heap_counter_names_the_stage_that_keeps_the_memory(tmp_path, monkeypatch):
    if heap.find_compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("VLMTRACE_CACHE_DIR", str(tmp_path / "cache"))
    counted = _host_verdict(tmp_path, str(heap.build()))
    assert counted.stage == sc.STAGE_PROMPT, counted.evidence
    assert counted.evidence["stage_share"] > 0.9 and "heap counter" in counted.evidence["stages_read_by"]

    # The same run read by RSS alone: part of the pages rose in vision preprocessing (how much varies from
    # run to run, 35-65 % of them on this machine), so prompt processing holds less of the growth.
    resident = _host_verdict(tmp_path, None)
    assert "stages_read_by" not in resident.evidence
    retained = resident.evidence["retained_by_stage"]
    assert retained.get(sc.STAGE_VISION_PREPROCESS, 0) > 0.2 * sum(v for v in retained.values() if v > 0)
