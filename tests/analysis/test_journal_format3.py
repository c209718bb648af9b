"""Journal format 3 (compact ends, readings as arrays) is read as what it stands for: every committed GPU
journal, re-encoded by the writer's own encoder, gives the analysis the same spans, samples, in-flight
spans, crash report and verdicts as the journal as it was recorded (formats 1 and 2)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from conftest import CPU_RUNS, GPU_RUNS, analyse
from vlmtrace.analysis.pipeline import Analysis
from vlmtrace.analysis.readers.detect import read_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from journal_bytes import reencoded  # the benchmark's re-encoder: the writer's own encoder

GPU = Path(__file__).parent / "data" / "gpu"
MATRIX_SAMPLE = sorted(GPU_RUNS.glob("*.jsonl.gz"))[::40]
CPU_SAMPLE = sorted(next(iter(sorted(CPU_RUNS.iterdir()))).glob("*.jsonl.gz"))[:1]
JOURNALS = [*sorted(GPU.glob("*.jsonl.gz")), *MATRIX_SAMPLE, *CPU_SAMPLE]


def _as_format3(path: Path, folder: Path) -> Path:
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    compact = folder / path.name.removesuffix(".gz")
    compact.write_bytes(b"".join(reencoded(lines)))
    return compact


def _verdicts(analysis: Analysis) -> list[tuple]:
    return [
        (v.component, v.klass, v.stage, round(v.slope_bytes_per_request or 0.0, 3)) for v in analysis.summary.verdicts
    ]


@pytest.mark.parametrize("path", JOURNALS, ids=lambda path: path.name)
def test_a_journal_reencoded_as_format3_is_analysed_as_recorded(path: Path, tmp_path: Path):
    compact = _as_format3(path, tmp_path)
    header = json.loads(compact.read_bytes().split(b"\n", 1)[0])
    assert header["v"] == 3
    assert compact.stat().st_size < 0.7 * len(gzip.decompress(path.read_bytes()))
    recorded, reencoded_analysis = analyse(path), analyse(compact)
    assert _verdicts(reencoded_analysis) == _verdicts(recorded)
    assert reencoded_analysis.summary.requests == recorded.summary.requests
    assert reencoded_analysis.summary.crashed == recorded.summary.crashed
    before, after = read_inputs([str(path)]), read_inputs([str(compact)])
    assert after.spans.finish().equals(before.spans.finish())
    assert after.samples.finish().equals(before.samples.finish())
    assert [(s.name, s.span_id, s.kind, s.thread, s.start_ns, s.attributes) for s in after.in_flight] == [
        (s.name, s.span_id, s.kind, s.thread, s.start_ns, s.attributes) for s in before.in_flight
    ]
    assert [(f.line, f.text) for f in after.fatal] == [(f.line, f.text) for f in before.fatal]
    assert [p.reason for p in after.problems] == [p.reason for p in before.problems]
