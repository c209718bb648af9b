"""`vlmtrace report` against empty, special, oversized and malicious inputs: the documented exit code
(0 no leak, 1 leak with --fail-on-leak, 2 bad or empty input, 3 internal error), a one-line message,
and a partial report wherever the rest could be read. Every hostile input is generated here."""

from __future__ import annotations

import gzip
import os
import pickle
import time
from pathlib import Path

import orjson
import pytest
from synthetic import MiB, Scenario
from typer.testing import CliRunner

from vlmtrace import semconv as sc
from vlmtrace.analysis.crash import CHAIN_SPANS, MAX_CHAIN_GROUPS
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.readers.files import EXPANDED_BYTES_FLOOR, EXPANDED_BYTES_VARIABLE, ReadLimits
from vlmtrace.analysis.trace_data import MAX_PROBLEMS_PER_SOURCE
from vlmtrace.cli.main import app

runner = CliRunner()
NS = 10**9
HEADER = {
    "k": "header",
    "v": 2,
    "t": 1_760_000_000 * NS,
    "pid": 7,
    "host": "h",
    "resource": {"service.name": "lmdeploy"},
}


def _report(tmp_path: Path, *arguments: str, env: dict | None = None):
    return runner.invoke(
        app, ["report", *arguments, "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "s.json")], env=env
    )


def _summary(tmp_path: Path) -> dict:
    return orjson.loads((tmp_path / "s.json").read_bytes())


def _samples(count: int, t0: int = HEADER["t"]) -> bytes:
    return b"".join(
        orjson.dumps({"k": "sample", "t": t0 + i * NS // 10, "attrs": {sc.MEM_TORCH_ALLOCATED: 1 * MiB}}) + b"\n"
        for i in range(count)
    )


@pytest.mark.parametrize("kind", ["empty file", "empty directory", "directory without traces", "missing"])
def test_empty_or_missing_input_exits_2_and_writes_no_report(tmp_path: Path, kind: str):
    target = tmp_path / "in"
    if kind == "empty file":
        target.write_bytes(b"")
    elif kind != "missing":
        target.mkdir()
        if kind == "directory without traces":
            (target / "notes.txt").write_text("hello")
    result = _report(tmp_path, str(target), "--fail-on-leak")
    assert result.exit_code == 2, result.output
    assert "Nothing to analyse" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r.html").exists()


def test_internal_error_exits_3_with_one_line_and_the_traceback_in_a_file(tmp_path: Path, journal, monkeypatch):
    path, _ = journal(Scenario(requests=10))

    def broken(*_args, **_kwargs):
        raise RuntimeError("analysis exploded")

    monkeypatch.setattr("vlmtrace.analysis.pipeline.analyze", broken)
    result = _report(tmp_path, str(path))
    assert result.exit_code == 3
    assert "internal error" in result.output and "RuntimeError: analysis exploded" in result.output
    assert "Traceback" not in result.output
    traceback_file = result.output.split("traceback in ", 1)[1].split(";", 1)[0].replace("\n", "")
    assert "Traceback" in Path(traceback_file).read_text()
    os.unlink(traceback_file)
    debug = _report(tmp_path, str(path), "--debug")
    assert debug.exit_code == 3 and "Traceback" in debug.output


def test_internal_error_without_a_writable_temporary_directory_is_still_one_line(tmp_path: Path, journal, monkeypatch):
    path, _ = journal(Scenario(requests=10))

    def broken(*_args, **_kwargs):
        raise RuntimeError("analysis exploded\x1b]0;title\x07")

    monkeypatch.setattr("vlmtrace.analysis.pipeline.analyze", broken)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "missing"))  # as on a full or read-only disk
    result = _report(tmp_path, str(path))
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert "RuntimeError: analysis exploded\\x1b]0;title\\x07" in result.output
    assert "the traceback could not be written" in result.output


def test_output_naming_an_input_is_refused(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=10))
    before = path.read_bytes()
    result = runner.invoke(app, ["report", str(path), "-o", str(path)])
    assert result.exit_code == 2 and "it is one of the inputs" in result.output
    via_json = runner.invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "r.html"), "--json", str(path)])
    assert via_json.exit_code == 2
    assert path.read_bytes() == before


def test_own_outputs_in_the_journal_directory_are_skipped_by_content(tmp_path: Path, journal):
    directory = tmp_path / "journals"
    directory.mkdir()
    journal(Scenario(requests=10), name="journals/run.jsonl")
    arguments = [str(directory), "-o", str(directory / "report.json"), "--json", str(directory / "summary.json")]
    assert runner.invoke(app, ["report", *arguments]).exit_code == 0
    again = runner.invoke(
        app, ["report", str(directory), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "s.json")]
    )
    assert again.exit_code == 0, again.output
    assert [entry["source"] for entry in _summary(tmp_path)["inputs"]] == [str(directory / "run.jsonl")]


def test_collector_metrics_beside_journals_are_skipped_with_one_line(tmp_path: Path, journal):
    journal(Scenario(requests=20), name="run.jsonl")
    (tmp_path / "otlp").mkdir()
    metric = {"resourceMetrics": [{"resource": {}, "scopeMetrics": [{"metrics": [{"name": "vlmtrace.memory"}]}]}]}
    with gzip.open(tmp_path / "otlp" / "metrics.jsonl.gz", "wb") as handle:
        handle.write(b"".join(orjson.dumps(metric) + b"\n" for _ in range(80)))
    with gzip.open(tmp_path / "server.log.gz", "wb") as handle:
        handle.write(b"INFO: started server\n" * 50)
    result = runner.invoke(
        app, ["report", str(tmp_path), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "s.json")]
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("metrics.jsonl.gz") == 1 and "not traces" in result.output
    assert result.output.count("server.log.gz") == 1 and "skipped (found in a directory)" in result.output
    named = runner.invoke(
        app, ["report", str(tmp_path / "server.log.gz"), str(tmp_path / "run.jsonl"), "-o", str(tmp_path / "r.html")]
    )
    assert named.exit_code == 2  # named on the command line, it is bad input
    assert "No memory readings" not in result.output
    (read,) = _summary(tmp_path)["inputs"]
    assert read["samples"] > 0 and read["spans"] > 0


def test_truncated_gzip_is_a_read_problem_not_a_crash(tmp_path: Path, journal):
    path, _ = journal(
        Scenario(requests=60, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM}),
        name="run.jsonl.gz",
        compress=True,
    )
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    result = _report(tmp_path, str(path))
    assert result.exit_code == 2, result.output
    summary = _summary(tmp_path)
    assert not summary["crashed"] and summary["in_flight"] == []
    assert summary["leak_found"]
    assert any("cannot be read to its end" in p["reason"] for p in summary["problems"])


def test_special_files_get_an_accurate_message(tmp_path: Path):
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    result = _report(tmp_path, str(loop), str(fifo), "/dev/zero")
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "symbolic link loop" in output and "FIFO" in output and "a device, not a file" in output
    assert "no such file" not in output


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists any directory")
def test_unreadable_subdirectory_is_reported(tmp_path: Path, journal):
    journal(Scenario(requests=10))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        result = runner.invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "r.html")])
    finally:
        locked.chmod(0o700)
    assert result.exit_code == 2 and "cannot be listed" in result.output


def test_byte_order_mark_before_the_journal_header_is_accepted(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=10))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    result = _report(tmp_path, str(path))
    assert result.exit_code == 0, result.output
    assert _summary(tmp_path)["processes"][0]["process"] == "gpu-node-1:4242"


def test_file_name_that_is_not_utf8(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=10))
    odd = os.path.join(os.fsencode(tmp_path), b"run-\xff.jsonl")
    os.rename(path, odd)
    result = _report(tmp_path, os.fsdecode(odd))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").stat().st_size > 0
    assert _summary(tmp_path)["inputs"][0]["source"].endswith("run-\ufffd.jsonl")


def test_gzip_expanding_beyond_the_bound_gives_a_partial_report(tmp_path: Path):
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(orjson.dumps(HEADER) + b"\n" + _samples(20_000))
    result = _report(tmp_path, str(path), env={EXPANDED_BYTES_VARIABLE: str(256 * 1024)})
    assert result.exit_code == 2, result.output
    assert "larger than 262,144 bytes" in result.output and "reading stopped there" in result.output
    summary = _summary(tmp_path)
    assert not summary["crashed"]
    (info,) = summary["inputs"]
    assert 0 < info["samples"] < 20_000


def test_default_bound_stops_a_highly_compressible_gzip(tmp_path: Path):
    """The real default: many gzip members of blank lines, compressed once, expand past the floor."""
    member = gzip.compress((b" " * 65535 + b"\n") * 256, compresslevel=9)  # 16 MiB of content each
    path = tmp_path / "blank.jsonl.gz"
    with open(path, "wb") as handle:
        handle.write(gzip.compress(orjson.dumps(HEADER) + b"\n"))
        for _ in range(EXPANDED_BYTES_FLOOR // (16 * MiB) + 1):
            handle.write(member)
    assert path.stat().st_size * ReadLimits().expansion_ratio < EXPANDED_BYTES_FLOOR
    data = read_inputs([str(path)])
    (problem,) = [p for p in data.problems if p.severity == "error"]
    assert "reading stopped there" in problem.reason


def test_nested_lists_are_not_followed(tmp_path: Path):
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * 1000 + b"]" * 1000)
    data = read_inputs([str(path)])
    assert [p.reason for p in data.problems] == ["not a trace document (expected a list of JSON objects)"]


def _snapshot(segments: object) -> bytes:
    return pickle.dumps({"segments": segments, "device_traces": []}, protocol=4)


def test_snapshot_of_shared_references_is_walked_within_its_bound(tmp_path: Path):
    block = {
        "size": 512,
        "state": "active_allocated",
        "frames": [{"filename": "app.py", "name": "f", "line": 1}] * 1000,
    }
    segment = {"device": 0, "total_size": 1 << 20, "blocks": [block] * 20_000}
    path = tmp_path / "shared.pickle"
    path.write_bytes(_snapshot([segment] * 20_000))  # 400 million blocks in a few hundred KB
    assert path.stat().st_size < 300_000
    data = read_inputs([str(path)], limits=ReadLimits(snapshot_blocks=50_000))
    (summary,) = data.snapshots
    assert summary.devices[0]["allocated_bytes"] == 50_000 * 512
    assert any("first 50,000 were summarised" in p.reason for p in data.problems)


def test_snapshot_fields_of_the_wrong_type_are_a_problem_on_that_file_only(tmp_path: Path, journal):
    path, _ = journal(Scenario(requests=10))
    segments = [
        {
            "device": [0],
            "total_size": "big",
            "blocks": [{"size": "x", "state": "active_allocated", "frames": "f"}],
            "is_expandable": "yes",
        },
        {"device": 1, "total_size": 4096, "blocks": "none"},
        "not a segment",
    ]
    snapshot = tmp_path / "odd.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": segments, "device_traces": 5, "allocator_settings": []}))
    result = _report(tmp_path, str(path), str(snapshot))
    assert result.exit_code == 2, result.output
    summary = _summary(tmp_path)
    assert summary["spans"] > 0 and len(summary["snapshots"]) == 1
    (problem,) = summary["problems"]
    assert problem["source"] == str(snapshot) and "6 snapshot fields of the wrong type" in problem["reason"]


def _start(span_id: str, parent: str | None, name: str, t: int) -> bytes:
    record = {
        "k": "start",
        "t": t,
        "trace_id": "a" * 32,
        "span_id": span_id,
        "parent_id": parent,
        "name": name,
        "attrs": {},
    }
    return orjson.dumps(record) + b"\n"


def test_in_flight_broom_is_grouped_and_bounded(tmp_path: Path):
    """A 3000-span chain with 3000 leaves under its tip: leaves x depth would be 9 million entries."""
    depth, leaves, t = 3000, 3000, HEADER["t"]
    lines = [orjson.dumps(HEADER) + b"\n"]
    lines += [_start(f"{i:016x}", f"{i - 1:016x}" if i else None, "handle", t + i) for i in range(depth)]
    lines += [_start(f"{depth + i:016x}", f"{depth - 1:016x}", "leaf", t + depth + i) for i in range(leaves)]
    path = tmp_path / "broom.jsonl"
    path.write_bytes(b"".join(lines) + _samples(5, t + 2 * NS))
    started = time.monotonic()
    (crashed,) = analyze(read_inputs([str(path)])).crashed
    assert time.monotonic() - started < 60  # the unbounded walk took minutes and gigabytes
    (group,) = crashed.chain_groups
    assert group.count == leaves and len(group.spans) == CHAIN_SPANS + 1
    assert group.elided == depth + 1 - len(group.spans)
    assert [span.name for span in group.spans[:2]] == ["handle", "handle"] and group.spans[-1].name == "leaf"


def test_identical_in_flight_chains_are_grouped_with_a_count(tmp_path: Path):
    t = HEADER["t"]
    lines = [orjson.dumps(HEADER) + b"\n"]
    for i in range(53):
        lines += [
            _start(f"{3 * i:016x}", None, "pipeline", t + i),
            _start(f"{3 * i + 1:016x}", f"{3 * i:016x}", "chat", t + i),
        ]
    lines += [_start(f"{10_000 + i:016x}", None, f"distinct-{i}", t + 100 + i) for i in range(MAX_CHAIN_GROUPS + 5)]
    path = tmp_path / "many.jsonl"
    path.write_bytes(b"".join(lines) + _samples(5, t + NS))
    (crashed,) = analyze(read_inputs([str(path)])).crashed
    assert crashed.chain_groups[0].count == 53 and [s.name for s in crashed.chain_groups[0].spans] == [
        "pipeline",
        "chat",
    ]
    assert len(crashed.chain_groups) == MAX_CHAIN_GROUPS and crashed.chain_groups_left_out == 6


def test_a_line_of_a_million_bad_records_lists_a_bounded_number_of_problems(tmp_path: Path):
    path = tmp_path / "flood.jsonl"
    path.write_bytes(orjson.dumps({"resourceSpans": [1] * 1_000_000}) + b"\n")
    data = read_inputs([str(path)])
    assert len(data.problems) == MAX_PROBLEMS_PER_SOURCE + 1
    assert data.problems[-1].reason.startswith(f"more than {MAX_PROBLEMS_PER_SOURCE} problems")
