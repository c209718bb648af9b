"""The journal reader: crash-cut files, faulthandler text, rotation, several writers, and reading a file per process."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from synthetic import Scenario

from vlmtrace.analysis.readers import parallel
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.readers.journal import JournalReader, read_journal


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_crashed_journal_keeps_in_flight_spans_and_the_fatal_report(journal):
    path, truth = journal(Scenario(requests=30, crash_at_request=20))
    data = read_journal([path])
    assert not data.processes[0].clean_end
    assert sorted(span.name for span in data.in_flight) == sorted(truth.in_flight)
    assert data.spans.count == truth.spans
    (fatal,) = data.fatal
    assert fatal.text.startswith("Fatal Python error: Aborted")
    (note,) = data.problems
    assert note.severity == "note" and "truncated last record" in note.reason
    assert note.line == fatal.line - 1
    assert _lines(path)[note.line - 1].startswith(b'{"k":"end"')


def test_clean_journal_has_an_end_marker_and_nothing_in_flight(journal):
    path, truth = journal(Scenario(requests=12))
    data = read_journal([path])
    assert data.processes[0].clean_end and data.in_flight == [] and data.problems == []
    assert data.spans.count == truth.spans


def test_corrupt_line_in_the_middle_is_reported_with_its_line_number(journal):
    path, truth = journal(Scenario(requests=12))
    lines = _lines(path)
    lines.insert(40, b"garbage that is not json\n")
    path.write_bytes(b"".join(lines))
    data = read_journal([path])
    (problem,) = data.problems
    assert (problem.line, problem.severity) == (41, "error")
    assert data.spans.count == truth.spans


def test_rotated_files_are_read_in_sequence_whatever_their_listing_order(tmp_path: Path, journal):
    path, truth = journal(Scenario(requests=20))
    lines = _lines(path)
    header = orjson.loads(lines[0])
    folder = tmp_path / "journal"
    folder.mkdir()
    cut = len(lines) // 2
    second_header = orjson.dumps({**header, "seq": 1}) + b"\n"
    (folder / "vlmtrace-gpu-node-1-4242-1760000000.1.jsonl").write_bytes(second_header + b"".join(lines[cut:]))
    (folder / "vlmtrace-gpu-node-1-4242-1760000000.0.jsonl").write_bytes(b"".join(lines[:cut]))
    (folder / "report.html").write_text("<!DOCTYPE html>")  # not a trace: left alone
    data = read_journal([folder])
    assert data.problems == []
    assert data.in_flight == []  # starts in .0 whose ends are in .1 are not in flight
    assert data.spans.count == truth.spans
    assert len(data.processes) == 1 and data.processes[0].clean_end
    assert len(data.processes[0].sources) == 2


def test_each_writer_in_a_directory_is_its_own_process(tmp_path: Path):
    from synthetic import write_journal

    folder = tmp_path / "journal"
    folder.mkdir()
    write_journal(Scenario(requests=8, pid=100), folder / "vlmtrace-h-100-1.0.jsonl")
    write_journal(Scenario(requests=8, pid=200, crash_at_request=5), folder / "vlmtrace-h-200-1.0.jsonl")
    data = read_journal([folder])
    clean = {info.label: info.clean_end for info in data.processes}
    assert clean == {"gpu-node-1:100": True, "gpu-node-1:200": False}
    assert {data.processes[span.process].label for span in data.in_flight} == {"gpu-node-1:200"}


def test_records_of_two_processes_in_one_file_are_noted(journal):
    path, _ = journal(Scenario(requests=6))
    lines = _lines(path)
    other = orjson.dumps({**orjson.loads(lines[0]), "pid": 99}) + b"\n"
    path.write_bytes(b"".join([*lines[:30], other, *lines[30:]]))
    data = read_journal([path])
    assert len(data.processes) == 2
    assert [(p.line, p.severity) for p in data.problems] == [(31, "note")]


def test_journal_without_header_is_named_after_its_file(journal):
    path, truth = journal(Scenario(requests=6))
    path.write_bytes(b"".join(_lines(path)[1:]))
    data = read_journal([path])
    assert data.processes[0].label == path.name
    assert data.spans.count == truth.spans


def _rotate(path: Path, folder: Path, parts: int) -> None:
    """`path` cut into `parts` rotated files as the writer leaves them, each opening with its header."""
    lines = _lines(path)
    header = orjson.loads(lines[0])
    cuts = [1 + (len(lines) - 1) * part // parts for part in range(parts + 1)]
    for seq, (first, last) in enumerate(itertools.pairwise(cuts)):
        own_header = orjson.dumps({**header, "seq": seq}) + b"\n"
        (folder / f"vlmtrace-gpu-node-1-{header['pid']}-1760000000.{seq}.jsonl").write_bytes(
            own_header + b"".join(lines[first:last])
        )


def test_a_clean_journal_is_read_in_columns(tmp_path: Path, journal, monkeypatch):
    path, truth = journal(Scenario(requests=40))
    folder = tmp_path / "journal"
    folder.mkdir()
    _rotate(path, folder, 3)

    def line_by_line(*_):
        raise AssertionError("a clean journal file went to the line reader")

    monkeypatch.setattr(JournalReader, "read_file", line_by_line)  # inherited by the forked workers
    data = read_inputs([str(folder)])
    assert data.spans.count == truth.spans and data.problems == [] and data.in_flight == []
    assert data.processes[0].clean_end and len(data.processes[0].sources) == 3


@pytest.mark.parametrize("crash", [False, True])
def test_reading_a_file_per_process_gives_what_reading_in_one_process_gives(
    tmp_path: Path, journal, monkeypatch, crash
):
    from synthetic import write_journal

    path, truth = journal(Scenario(requests=300, batch=3, crash_at_request=290 if crash else None))
    lines = _lines(path)
    lines.insert(len(lines) * 3 // 4, b"not json\n")
    # A thread name that JSON escapes, decoded alike by the line reader and by DuckDB.
    path.write_bytes(b"".join(lines).replace(b'"thread":"vision-worker"', b'"thread":"vision \\"worker\\""'))
    folder = tmp_path / "journal"
    folder.mkdir()
    _rotate(path, folder, 5)
    killed = folder / "vlmtrace-gpu-node-1-200-1760000000.0.jsonl"
    write_journal(Scenario(requests=20, pid=200), killed)
    killed.write_bytes(b"".join(_lines(killed)[:100]))  # killed between two records: spans in flight, no end marker
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert parallel.worker_count(6) == 3
    monkeypatch.setenv(parallel.PROCESSES_VARIABLE, "1")  # one reader at a time: the memory bound's setting
    assert parallel.worker_count(6) == 1
    one_reader = read_inputs([str(folder)])
    monkeypatch.delenv(parallel.PROCESSES_VARIABLE)
    split = read_inputs([str(folder)])  # the clean files in columns (DuckDB), the others line by line
    monkeypatch.setattr(parallel, "worker_count", lambda files: 0)
    whole = read_inputs([str(folder)])  # every file line by line, in this process
    assert split.spans.count == whole.spans.count > truth.spans
    assert [(p.source, p.line, p.reason) for p in split.problems] == [
        (p.source, p.line, p.reason) for p in whole.problems
    ]
    assert any(p.reason.startswith("not valid JSON") for p in whole.problems)
    assert sorted(s.span_id for s in split.in_flight) == sorted(s.span_id for s in whole.in_flight)
    # Starts in one file whose ends are in a later one are not in flight; the killed process's are.
    in_flight = [whole.processes[span.process].label for span in whole.in_flight]
    assert in_flight.count("gpu-node-1:4242") == len(truth.in_flight) and in_flight.count("gpu-node-1:200") > 0
    assert [(f.line, f.text) for f in split.fatal] == [(f.line, f.text) for f in whole.fatal]
    assert [(p.label, p.clean_end, p.last_record_ns, p.sources) for p in split.processes] == [
        (p.label, p.clean_end, p.last_record_ns, p.sources) for p in whole.processes
    ]
    split_spans, whole_spans = split.spans.finish(), whole.spans.finish()
    assert split_spans.equals(whole_spans) and one_reader.spans.finish().equals(whole_spans)
    whole_features = whole.spans.take_features().columns
    for reader in (split, one_reader):
        features = reader.spans.take_features().columns
        assert features.keys() == whole_features.keys()
        for key, (rows, values) in whole_features.items():
            assert np.array_equal(features[key][0], rows) and np.array_equal(features[key][1], values, equal_nan=True)
    assert whole_spans["thread"].notna().all()  # threads of spans started in an earlier file than they ended in
    assert 'vision "worker"' in set(whole_spans["thread"])
    assert split.samples.finish().equals(whole.samples.finish())


def test_header_longer_than_the_detection_window(journal):
    path, truth = journal(Scenario(requests=6))
    lines = _lines(path)
    header = orjson.loads(lines[0])
    header["argv"] = ["--prompt", "x" * 200_000]
    path.write_bytes(orjson.dumps(header) + b"\n" + b"".join(lines[1:]))
    data = read_journal([path])
    assert data.spans.count == truth.spans and data.problems == []


def test_progress_is_reported_up_to_the_total(journal):
    path, _ = journal(Scenario(requests=200))
    seen: list[tuple[int, int]] = []
    read_journal([path], progress=lambda done, total: seen.append((done, total)))
    size = path.stat().st_size
    assert seen[-1] == (size, size)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_zero_bytes_left_by_a_mapped_writer_are_a_crash_not_corruption(journal):
    path, _truth = journal(Scenario(requests=12))
    lines = _lines(path)[:-1]  # no end marker
    cut = lines[-1][: len(lines[-1]) // 2]
    path.write_bytes(
        b"".join(lines[:-1])
        + cut
        + b"\0" * 5000
        + b'\nFatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n  File "x.py", line 1 in <module>'
    )
    data = read_journal([path])
    assert [(p.severity, "truncated" in p.reason) for p in data.problems] == [("note", True)]
    assert len(data.fatal) == 1 and not data.processes[0].clean_end


def test_a_writer_restarted_after_a_crash_appends_after_the_zeros(journal):
    path, _truth = journal(Scenario(requests=12))
    lines = _lines(path)
    path.write_bytes(b"".join(lines[:-2]) + lines[-2][:30] + b"\0" * 3000 + b"".join(lines))
    data = read_journal([path])
    assert [p.severity for p in data.problems] == ["note"]
    assert data.processes[0].clean_end


def test_spans_in_two_inputs_are_counted_once(tmp_path: Path, journal):
    from vlmtrace.analysis.step2_preparing.tables import build_tables

    path, truth = journal(Scenario(requests=10))
    copy = tmp_path / "copy-of-the-journal.jsonl"
    copy.write_bytes(path.read_bytes())
    data = read_inputs([str(path), str(copy)])
    assert data.spans.count == 2 * truth.spans
    tables = build_tables(data)
    assert len(tables.spans) == truth.spans
    assert [p.reason for p in data.problems] == [f"{truth.spans} spans appeared in more than one input; counted once"]
    # The input features of the spans kept follow them: the requests read as from the journal alone.
    alone = build_tables(read_inputs([str(path)]))
    assert tables.requests["image_pixels"].notna().all()
    pd.testing.assert_frame_equal(tables.requests, alone.requests)
    pd.testing.assert_frame_equal(tables.prompt_ends, alone.prompt_ends)


def test_paths_may_be_path_objects(tmp_path: Path, journal):
    """`read_inputs` is public: `pathlib.Path`s are read as their strings are, by the forked readers too."""
    path, truth = journal(Scenario(requests=20))
    folder = tmp_path / "journal"
    folder.mkdir()
    _rotate(path, folder, 3)
    for paths in ([folder], list(folder.iterdir()), [Path(path)]):
        data = read_inputs(paths)
        assert data.problems == [] and data.spans.count == truth.spans
