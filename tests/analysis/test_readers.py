"""Every supported format is recognised by content and read, including real files from other projects."""

from __future__ import annotations

import base64
import gzip
from pathlib import Path

import orjson
import pytest
from synthetic import MiB, Scenario, journal_to_otlp

from conftest import DATA, SHARED_FORMATS
from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.readers.otlp_json import hex_id

# file → (format, spans, processes) as SOURCES.md describes them
COPIED = {
    "jaeger-ui__2992f2a5b5d037a8aabffd08ef384237.json": ("Jaeger API v1", 2, 1),
    "jaeger__jaegerquery-fixture__otlp2jaeger-out.json": ("Jaeger API v1", 2, 1),
    "jaeger__uimodel-converter-v1__ui_01.json": ("Jaeger API v1", 5, 2),
    "jaeger-ui__api-v3-fixtures__getTrace-response.json.gz": ("Jaeger API v3", 40, 6),
    "jaeger__jaegerquery-apiv3-snapshots__GetTrace.json": ("Jaeger API v3", 1, 1),
    "jaeger__query-apiv3-snapshots__FindTraces_at-6ea13650.json": ("Jaeger API v3", 1, 1),
    "jaeger__query-apiv3-snapshots__TestGRPCGateway_GetTrace_at-50822390.json": ("Jaeger API v3", 1, 1),
    "opentelemetry-proto__examples__trace.json": ("OTLP JSON", 1, 1),
    "oats__servicegraph-testdata__5b584103c6fc5ddf423cb2fb6552d0f0.jsonl.gz": ("OTLP JSON", 82, 3),
    "jaeger-ui__utils-fixtures__otlp2jaeger-multi-in.jsonl": ("OTLP JSON", 4, 1),
    "jaeger__mcptools-testdata-skills__error_timeout_masked.json.gz": ("OTLP JSON", 26, 5),
    "kiali__tracingtest__responseTrace.json.gz": ("Tempo trace-by-id v1", 8, 5),
    "oats__tempo-responses-testdata__trace_by_id.json": ("Tempo trace-by-id v1", 3, 1),
    "tempo__tempopb__trace.json": ("Tempo trace-by-id v1", 1, 1),
}
SNAPSHOTS = {
    "silmont2000-assignment2-systems__mem_snapshot.pickle.gz": (9, 20),
    "MAGMA27-assignment2-systems__memory_snapshot.pickle.gz": (216, 455),
}
SHARED_SPANS = {
    "grafana__jaeger-datasource__mockJsonResponse.json": 2,
    "tempo__tempo-vulture-testdata__trace_at-cb4b58aa.json": 39,
    "tempo__docs-pushing-spans-with-http__v2-trace-response.json": 1,
    "tempo__servicegraphs-testdata__trace-with-virtual-nodes-inner-trace.json": 3,
    "tempo__tempo-vulture-testdata__trace_HEAD-inner-trace.json": 6,
}


def _errors(data):
    return [problem.describe() for problem in data.problems if problem.severity == "error"]


@pytest.mark.parametrize("name", sorted(COPIED))
def test_real_trace_files_are_read(name: str):
    data = read_inputs([str(DATA / name)])
    fmt, spans, processes = COPIED[name]
    assert _errors(data) == []
    assert [(item.format, item.spans) for item in data.inputs] == [(fmt, spans)]
    assert len(data.processes) == processes
    frame = data.spans.finish()
    assert frame["span_id"].notna().all()


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_torch_memory_snapshots_are_summarised(name: str):
    data = read_inputs([str(DATA / name)])
    assert _errors(data) == []
    (snapshot,) = data.snapshots
    segments, _blocks = SNAPSHOTS[name]
    assert sum(device["segments"] for device in snapshot.devices) == segments
    device = snapshot.devices[0]
    assert 0 < device["allocated_bytes"] <= device["reserved_bytes"]
    assert device["allocated_bytes"] + device["cached_free_bytes"] == device["reserved_bytes"]
    assert snapshot.top_sites and snapshot.trace_entries > 0


def _shared_files() -> list[Path]:
    if not SHARED_FORMATS.is_dir():
        return []
    return sorted(
        path for path in SHARED_FORMATS.rglob("*") if path.is_file() and path.suffix in (".json", ".jsonl", ".pickle")
    )


@pytest.mark.skipif(
    not SHARED_FORMATS.is_dir(),
    reason=f"the collection of other projects' trace and memory-snapshot files is not at {SHARED_FORMATS}; "
    "the samples of it in tests/analysis/data/formats are read instead",
)
@pytest.mark.parametrize("path", _shared_files(), ids=lambda path: path.name)
def test_every_shared_format_file_is_read(path: Path):
    data = read_inputs([str(path)])
    assert _errors(data) == []
    if path.suffix == ".pickle":
        assert len(data.snapshots) == 1
    else:
        assert data.spans.count > 0
    if path.name in SHARED_SPANS:
        assert data.spans.count == SHARED_SPANS[path.name]


def test_ids_are_hex_whatever_the_source_wrote():
    assert (
        hex_id("5B8EFFF798038103D269B633813FC60C", 16) == "5b8efff798038103d269b633813fc60c"
    )  # uppercase hex, not base64
    assert hex_id("AAAAAAAAAJYAAAAAAAAAoA==", 16) == "000000000000009600000000000000a0"
    assert hex_id("Sc130fnc2TY=", 8) == base64.b64decode("Sc130fnc2TY=").hex()
    assert hex_id("", 8) is None
    tempo = read_inputs([str(DATA / "tempo__tempopb__trace.json")]).spans.finish()
    assert tempo["trace_id"][0] == "5b8efff798038103d269b633813fc60c"
    assert tempo["parent_id"][0] == "eee19b7ec3c1b173"


def test_overflowed_timestamps_are_kept_out_of_timelines():
    data = read_inputs([str(DATA / "jaeger__query-apiv3-snapshots__FindTraces_at-6ea13650.json")])
    from vlmtrace.analysis.step2_preparing.tables import build_tables

    tables = build_tables(data)
    assert len(tables.spans) == 1 and tables.readings.empty
    assert any("no usable start or end time" in problem.reason for problem in data.problems)


def test_duplicate_span_ids_in_one_jaeger_trace_are_both_kept():
    frame = read_inputs([str(DATA / "jaeger__jaegerquery-fixture__otlp2jaeger-out.json")]).spans.finish()
    assert frame["span_id"].nunique() == 1 and len(frame) == 2


def test_gzip_is_recognised_by_its_bytes_not_its_name(tmp_path: Path):
    hidden = tmp_path / "trace.json"
    hidden.write_bytes(gzip.compress((DATA / "opentelemetry-proto__examples__trace.json").read_bytes()))
    data = read_inputs([str(hidden)])
    assert [(item.format, item.spans) for item in data.inputs] == [("OTLP JSON", 1)]


def test_unknown_format_names_the_file_and_line(tmp_path: Path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    data = read_inputs([str(path)])
    assert [(p.source, p.line, p.severity) for p in data.problems] == [(str(path), 1, "error")]


def test_corrupt_json_document_names_its_line(tmp_path: Path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "resourceSpans": [\n    {"resource": {}\n')
    data = read_inputs([str(path)])
    (problem,) = data.problems
    assert problem.source == str(path) and problem.line == 4 and problem.severity == "error"


def test_bad_line_in_json_lines_is_skipped_and_the_rest_read(tmp_path: Path):
    lines = (DATA / "jaeger-ui__utils-fixtures__otlp2jaeger-multi-in.jsonl").read_bytes().splitlines()
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"\n".join([*lines[:2], b'{"resourceSpans": [tru', *lines[2:]]) + b"\n")
    data = read_inputs([str(path)])
    assert data.spans.count == 4
    assert [(p.line, p.severity) for p in data.problems] == [(3, "error")]


def test_truncated_gzip_keeps_what_came_before(tmp_path: Path, journal):
    source, _ = journal(Scenario(requests=40), name="full.jsonl")
    packed = gzip.compress(source.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    data = read_inputs([str(cut)])
    assert data.spans.count > 50
    assert any(p.severity == "error" and p.source == str(cut) for p in data.problems)


def test_missing_file_is_a_problem_not_a_crash(tmp_path: Path):
    data = read_inputs([str(tmp_path / "nope.jsonl")])
    assert [p.reason for p in data.problems] == ["no such file"]


def test_otlp_copy_of_a_journal_carries_the_same_spans(tmp_path: Path, journal):
    source, truth = journal(
        Scenario(requests=30, devices=2, device_shares=(0.5, 0.5), device_totals=(80 << 30, 80 << 30))
    )
    otlp = tmp_path / "export.jsonl"
    journal_to_otlp(source, otlp, spans_per_line=50)
    data = read_inputs([str(otlp)])
    assert data.spans.count == truth.spans
    assert len(data.devices.finish()) == 2 * truth.spans
    assert data.processes[0].label == "gpu-node-1:4242"


def test_tempo_v2_response_with_base64_ids(tmp_path: Path, journal):
    source, truth = journal(Scenario(requests=10))
    otlp = tmp_path / "export.jsonl"
    journal_to_otlp(source, otlp, spans_per_line=10_000)
    document = orjson.loads(otlp.read_bytes().splitlines()[0])
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    path = tmp_path / "tempo-v2.json"
    path.write_bytes(orjson.dumps({"trace": document}))
    data = read_inputs([str(path)])
    frame = data.spans.finish()
    assert [item.format for item in data.inputs] == ["Tempo trace-by-id v2"]
    assert len(frame) == truth.spans and frame["span_id"].str.len().eq(16).all()


def test_jaeger_v1_arrays_arrive_as_json_text(tmp_path: Path):
    tags = [
        {"key": sc.STAGE, "type": "string", "value": sc.STAGE_REQUEST},
        {"key": sc.MEM_DEVICES, "type": "string", "value": "[0,1]"},
        {"key": sc.MEM_GPU_PROCESS + sc.PER_DEVICE_SUFFIX, "type": "string", "value": f"[{MiB},{2 * MiB}]"},
        {"key": sc.MEM_GPU_PROCESS, "type": "int64", "value": 3 * MiB},
    ]
    trace = {
        "traceID": "ab" * 8,
        "spans": [
            {
                "traceID": "ab" * 8,
                "spanID": "cd" * 8,
                "operationName": "chat m",
                "startTime": 1_700_000_000_000_000,
                "duration": 1000,
                "tags": tags,
                "processID": "p1",
            }
        ],
        "processes": {"p1": {"serviceName": "lmdeploy", "tags": []}},
    }
    path = tmp_path / "jaeger.json"
    path.write_bytes(orjson.dumps({"data": [trace]}))
    data = read_inputs([str(path)])
    devices = data.devices.finish()
    assert devices[sc.MEM_GPU_PROCESS].tolist() == [MiB, 2 * MiB]
