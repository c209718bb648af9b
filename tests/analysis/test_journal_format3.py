"""Journal format 3 (compact ends, readings as arrays) is read as what it stands for: every committed GPU
journal, re-encoded by the writer's own encoder, gives the analysis the same spans, samples, in-flight
spans, crash report and verdicts as the journal as it was recorded (formats 1 and 2)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from conftest import CPU_RUNS, GPU_RUNS, analyse
from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import Analysis
from vlmtrace.analysis.readers import parallel
from vlmtrace.analysis.readers.compact_records import FullRecords
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.readers.journal import JournalReader
from vlmtrace.analysis.trace_data import TraceData

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from journal_bytes import reencoded  # the benchmark's re-encoder: the writer's own encoder

GPU = Path(__file__).parent / "data" / "gpu"
MATRIX_SAMPLE = sorted(GPU_RUNS.glob("*.jsonl.gz"))[::40]
CPU_SAMPLE = sorted(next(iter(sorted(CPU_RUNS.iterdir()))).glob("*.jsonl.gz"))[:1]


def _recorded_format(path: Path) -> int:
    with gzip.open(path) as journal:
        return orjson.loads(journal.readline())["v"]


# The journals recorded in an earlier format, which the writer's encoder re-encodes; those recorded in
# format 3 are read as recorded (RECORDED_FORMAT3).
JOURNALS = [
    path for path in [*sorted(GPU.glob("*.jsonl.gz")), *MATRIX_SAMPLE, *CPU_SAMPLE] if _recorded_format(path) < 3
]
RECORDED_FORMAT3 = [path for path in sorted(GPU.glob("*.jsonl.gz")) if _recorded_format(path) == 3]


def _as_format3(path: Path, folder: Path, compress: bool = False) -> Path:
    """The journal re-encoded; `compress`: gzipped as it was, so that both are read by the same reader (a
    gzipped journal line by line, a plain one in columns where it can be)."""
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    compact = folder / (path.name if compress else path.name.removesuffix(".gz"))
    data = b"".join(reencoded(lines))
    compact.write_bytes(gzip.compress(data, 1) if compress else data)
    return compact


def _verdicts(analysis: Analysis) -> list[tuple]:
    return [
        (v.component, v.klass, v.stage, round(v.slope_bytes_per_request or 0.0, 3)) for v in analysis.summary.verdicts
    ]


@pytest.mark.parametrize("path", JOURNALS, ids=lambda path: path.name)
def test_a_journal_reencoded_as_format3_is_analysed_as_recorded(path: Path, tmp_path: Path):
    compact = _as_format3(path, tmp_path, compress=True)
    written = gzip.decompress(compact.read_bytes())
    assert json.loads(written.split(b"\n", 1)[0])["v"] == 3
    assert len(written) < 0.7 * len(gzip.decompress(path.read_bytes()))
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


def _as_recorded(path: Path, folder: Path) -> Path:
    """The journal unpacked, as the writer left it."""
    plain = folder / path.name.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    return plain


def _in_columns_and_by_lines(path: Path, monkeypatch) -> tuple[TraceData, TraceData]:
    """The file read as `report` reads a clean file, in columns (the line reader fails the test), then line by
    line in this process (`worker_count` stays patched for the caller's later reads)."""

    def line_by_line(*_):
        raise AssertionError(f"{path.name} went to the line reader")

    monkeypatch.setattr(JournalReader, "read_file", line_by_line)  # inherited by the forked workers
    in_columns = read_inputs([str(path)])
    monkeypatch.undo()
    monkeypatch.setattr(parallel, "worker_count", lambda files: 0)  # every file line by line, in this process
    return in_columns, read_inputs([str(path)])


@pytest.mark.parametrize(
    ("path", "written"),
    [
        (GPU / "turbomind-tensor.jsonl.gz", _as_format3),
        (GPU / "pytorch-host.jsonl.gz", _as_format3),
        (GPU / "capture-pytorch-tensor.jsonl.gz", _as_format3),
        (GPU / "pytorch-host.jsonl.gz", _as_recorded),
        (GPU_RUNS / "pt-host-engine-40x160-1MiB.jsonl.gz", _as_recorded),
        (GPU_RUNS / "pt-host-engine-40x160-1MiB.jsonl.gz", _as_format3),
        *((path, _as_recorded) for path in RECORDED_FORMAT3),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else value.__name__.strip("_"),
)
def test_a_clean_file_is_read_in_columns_exactly_as_the_line_reader_reads_it(
    path: Path, written, tmp_path: Path, monkeypatch
):
    """Read times too: a span's read-time delta is end minus start in integers in both readers, so that the
    readings the analyzer knows as one reading used twice (the same microsecond) are the same."""
    in_columns, by_lines = _in_columns_and_by_lines(written(path, tmp_path), monkeypatch)
    assert in_columns.problems == by_lines.problems == []
    assert in_columns.spans.finish().equals(by_lines.spans.finish())
    assert in_columns.samples.finish().equals(by_lines.samples.finish())
    columns_features, lines_features = in_columns.spans.take_features().columns, by_lines.spans.take_features().columns
    assert columns_features.keys() == lines_features.keys()
    for key, (rows, values) in lines_features.items():
        assert np.array_equal(columns_features[key][0], rows)
        assert np.array_equal(columns_features[key][1], values, equal_nan=True)


def _with_attributes(path: Path, attributes: dict) -> list[bytes]:
    """The journal's lines with `attributes` added to every start and end record."""
    lines = []
    for line in gzip.decompress(path.read_bytes()).splitlines(keepends=True):
        record = orjson.loads(line)
        if record["k"] in ("start", "end"):
            record["attrs"] = {**record["attrs"], **attributes}
        lines.append(orjson.dumps(record) + b"\n")
    return lines


def test_attribute_names_are_written_as_indices_and_read_back_with_a_users_names_as_they_were(tmp_path: Path):
    users = {"12": "digits only", "=x": 1, "my.attribute": [1, 2]}
    recorded = _with_attributes(GPU / "turbomind-tensor.jsonl.gz", users)
    compact = reencoded(recorded)
    written = b"".join(compact)
    assert json.loads(compact[0])["attr_keys"] == list(sc.JOURNAL_ATTR_KEYS)
    assert b'"vlmtrace.stage"' not in b"".join(compact[1:]) and b'"0":"request"' in written
    assert b'"=12":"digits only"' in written and b'"==x":1' in written and b'"my.attribute":[1,2]' in written
    full = FullRecords()
    records = [full.full(orjson.loads(line)) for line in compact]
    assert [record["attrs"] for record in records if record["k"] == "end"] == [
        record["attrs"] for record in map(orjson.loads, recorded) if record["k"] == "end"
    ]
    (tmp_path / "users.jsonl").write_bytes(written)
    (tmp_path / "recorded.jsonl").write_bytes(b"".join(recorded))
    after, before = read_inputs([str(tmp_path / "users.jsonl")]), read_inputs([str(tmp_path / "recorded.jsonl")])
    assert after.problems == before.problems == []
    assert after.spans.finish().equals(before.spans.finish())


def test_a_users_attribute_name_in_full_is_read_in_columns(tmp_path: Path, monkeypatch):
    compact = reencoded(_with_attributes(GPU / "pytorch-host.jsonl.gz", {"my.attribute": "value"}))
    (tmp_path / "run.jsonl").write_bytes(b"".join(compact))
    in_columns, by_lines = _in_columns_and_by_lines(tmp_path / "run.jsonl", monkeypatch)
    assert in_columns.problems == by_lines.problems == []
    assert in_columns.spans.finish().equals(by_lines.spans.finish())


@pytest.mark.parametrize("key", ["999", "007", "1" * 8])
def test_an_index_the_header_does_not_declare_is_dropped_and_counted_by_both_readers(
    key: str, tmp_path: Path, monkeypatch
):
    stage = str(sc.JOURNAL_ATTR_KEYS.index(sc.STAGE)).encode()
    compact = reencoded(gzip.decompress((GPU / "turbomind-tensor.jsonl.gz").read_bytes()).splitlines(keepends=True))
    hostile = [line.replace(b'"' + stage + b'":"request"', b'"' + key.encode() + b'":"request"') for line in compact]
    (tmp_path / "run.jsonl").write_bytes(b"".join(hostile))
    read = read_inputs([str(tmp_path / "run.jsonl")])
    monkeypatch.setattr(parallel, "worker_count", lambda files: 0)
    by_lines = read_inputs([str(tmp_path / "run.jsonl")])
    assert read.problems == by_lines.problems
    assert any("is not in the header's attr_keys" in problem.reason for problem in read.problems)
    spans = read.spans.finish()
    assert not (spans["stage"] == sc.STAGE_REQUEST).any()
    assert spans.equals(by_lines.spans.finish())


def test_a_link_to_a_start_in_the_same_file_is_its_span_id_and_in_flight_spans_get_it_whole(
    tmp_path: Path, monkeypatch
):
    recorded = gzip.decompress((GPU / "pytorch-host.jsonl.gz").read_bytes()).splitlines(keepends=True)
    steps = [orjson.loads(line) for line in recorded if b'"name":"lmdeploy.pytorch.forward"' in line]
    unended = {record["span_id"] for record in steps if record["k"] == "end"}
    unended = set(sorted(unended)[:30])  # these engine steps never end: in flight, with their links

    def cut(lines: list[bytes]) -> bytes:
        return b"".join(
            line for line in lines if not (line.startswith(b'{"k":"end"') and orjson.loads(line)["span_id"] in unended)
        )

    compact = reencoded(recorded)
    links = [link for line in compact[1:] for link in orjson.loads(line).get("links", [])]
    assert links and all(type(link) is str for link in links)  # every step's request started in this file
    full = FullRecords()
    whole = [full.full(orjson.loads(line)) for line in compact]
    assert [record["links"] for record in whole if record["k"] == "start"] == [
        record["links"] for record in map(orjson.loads, recorded) if record["k"] == "start"
    ]
    (tmp_path / "recorded.jsonl").write_bytes(cut(recorded))
    (tmp_path / "compact.jsonl").write_bytes(cut(compact))
    in_columns, by_lines = _in_columns_and_by_lines(tmp_path / "compact.jsonl", monkeypatch)
    before = read_inputs([str(tmp_path / "recorded.jsonl")])
    flying = [[(s.span_id, s.links) for s in data.in_flight] for data in (in_columns, by_lines, before)]
    assert flying[0] == flying[1] == flying[2]
    assert len(flying[0]) == 30 and all(links for _, links in flying[0])
