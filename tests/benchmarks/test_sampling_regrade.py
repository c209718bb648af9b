"""benchmarks/sampling_regrade.py: a committed GPU journal recorded as `detail_every=16` would have recorded it
(every request's detail for the first 200, 1 in 16 after) gets the verdict the journal as recorded gets: the
class, the stage and the rate, the stage read from the requests that recorded theirs."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import sampling_regrade  # after the path

from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.report.html import render_report

GPU = BENCHMARKS.parent / "tests" / "analysis" / "data" / "gpu"


def _analysed(records: list[dict], path: Path):
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    return analyze(read_inputs([str(path)]))


@pytest.mark.parametrize("journal", ["capture-turbomind-tensor", "capture-pytorch-tensor"])
def test_a_sampled_recording_gets_the_verdict_of_the_recorded_one(journal, tmp_path):
    records = sampling_regrade.read_records([str(GPU / f"{journal}.jsonl.gz")])
    full = _analysed(records, tmp_path / "recorded.jsonl")
    sampled = _analysed(sampling_regrade.sampled(records, 16, 200), tmp_path / "sampled.jsonl")

    requests = sampled.tables.spans[sampled.tables.spans["stage"] == sc.STAGE_REQUEST]
    skipped = int((requests[sc.REQUEST_DETAIL_SKIPPED] == 1).sum())
    assert len(requests) > 400 and skipped == sum(1 for i in range(200, len(requests)) if i % 16)
    assert sampled.summary.processes[0]["detail"]["requests_without_detail"] == skipped
    said = f"Stage detail on 1 in 16 requests after the first 200: {skipped} requests recorded none"
    assert said in render_report(sampled) and "Stage detail" not in render_report(full)
    (was,) = [v for v in full.summary.verdicts if v.component == "tensor"]
    (now,) = [v for v in sampled.summary.verdicts if v.component == "tensor"]
    assert was.klass == "tensor_leak" and was.stage == sc.STAGE_VISION_PREPROCESS
    assert (now.klass, now.stage) == (was.klass, was.stage)
    assert now.slope_bytes_per_request == pytest.approx(was.slope_bytes_per_request, rel=0.01)
    # What the requests without detail did is charged to a stage of their own, never to `request`.
    stages = sampled.stages[sampled.stages["component"] == "tensor"].set_index("stage")["retained_bytes"]
    assert stages.get(sc.STAGE_WITHOUT_DETAIL, 0) > 0
    assert stages.get(sc.STAGE_REQUEST, 0) < 0.1 * stages[sc.STAGE_VISION_PREPROCESS]
