"""`vlmtrace report` on inputs built to exhaust it, crash it or mislead it, each generated here: every
case exits 2 (never 3) with a message that says what was skipped or which bound stopped the reading
(`--max NAME=VALUE` raises it), within a gigabyte of memory, leaving every path but its outputs as it was."""

from __future__ import annotations

import gzip
import pickle
import re
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import MiB, Scenario, write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from vlmtrace import semconv as sc

NS = 10**9
T0 = 1_760_000_000 * NS
HEADER = {"k": "header", "v": 2, "t": T0, "pid": 7, "host": "h", "resource": {"service.name": "lmdeploy"}}
LEAK = Scenario(requests=60, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM})


def _lines(*records: dict) -> bytes:
    return b"".join(orjson.dumps(record) + b"\n" for record in records)


def _samples(count: int) -> list[dict]:
    return [
        {"k": "sample", "t": T0 + i * NS // 10, "attrs": {sc.MEM_TORCH_ALLOCATED: MiB * (1 + i)}} for i in range(count)
    ]


def _otlp(spans: int, attributes: list | None = None) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "s"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": f"{i:032x}",
                                "spanId": f"{i + 1:016x}",
                                "name": "request",
                                "startTimeUnixNano": str(T0 + i),
                                "endTimeUnixNano": str(T0 + i + 5),
                                "attributes": attributes or [],
                            }
                            for i in range(spans)
                        ]
                    }
                ],
            }
        ]
    }


def _snapshot(blocks: list, segments: int = 1) -> bytes:
    return pickle.dumps({"segments": [{"device": 0, "total_size": 1 << 30, "blocks": blocks}] * segments}, protocol=4)


def _frame(name: str) -> dict:
    return {"filename": "C:\\torch\\" + "a" * 2**20 + ".py", "name": name, "line": 1}


# Each builder writes its input into the directory and returns the arguments naming it.
def shared_frames(d: Path) -> list[str]:
    """The 1.2 KB gzipped snapshot that took 13 s: 2,000 references to one block of 64 1-MiB frames."""
    block = {"size": 1, "state": "active_allocated", "frames": [_frame("f")] * 64}
    (d / "b.pkl.gz").write_bytes(gzip.compress(_snapshot([block] * 2000)))
    return ["b.pkl.gz"]


def distinct_frame_lists(d: Path) -> list[str]:
    """Every block its own list of the same 1-MiB frames: 128 GB of file names to look at."""
    frame = _frame("f")
    (d / "lists.pkl.gz").write_bytes(
        gzip.compress(
            _snapshot([{"size": 1, "state": "active_allocated", "frames": [frame] * 64} for _ in range(2000)])
        )
    )
    return ["lists.pkl.gz"]


def many_blocks(d: Path) -> list[str]:
    block = {"size": 1, "state": "inactive", "frames": []}
    (d / "blocks.pickle").write_bytes(_snapshot([block] * 5000, segments=50))
    return ["blocks.pickle", "--max", "snapshot-blocks=1000"]


def many_processes(d: Path) -> list[str]:
    records = [record for pid in range(1, 2001) for record in ({**HEADER, "pid": pid}, *_samples(1))]
    (d / "procs.jsonl").write_bytes(_lines(*records))
    return ["procs.jsonl"]


def processes_across_files(d: Path) -> list[str]:
    for pid in range(1, 41):
        (d / f"p{pid}.jsonl").write_bytes(_lines({**HEADER, "pid": pid}, *_samples(5)))
    return [".", "--max", "processes=20"]


def many_records(d: Path) -> list[str]:
    (d / "records.jsonl").write_bytes(_lines(HEADER, *_samples(5000)))
    return ["records.jsonl", "--max", "records=1000"]


def many_spans(d: Path) -> list[str]:
    (d / "spans.json").write_bytes(orjson.dumps(_otlp(5000)))
    return ["spans.json", "--max", "spans=1000"]


def cpu_seconds(d: Path) -> list[str]:
    (d / "slow.jsonl.gz").write_bytes(gzip.compress(_lines(HEADER, *_samples(300_000)), compresslevel=1))
    return ["slow.jsonl.gz", "--max", "cpu-seconds=0.2"]


def sparse_hole(d: Path) -> list[str]:
    """A header, then a 20 GiB hole (4 KB on disk) that reads as zeros without a line end."""
    with open(d / "s.jsonl", "wb") as handle:
        handle.write(b'{"k":"header","v":2}\n')
        handle.truncate(20 << 30)
    return ["s.jsonl"]


def one_line_gigabyte(d: Path) -> list[str]:
    """A 1 GB OTLP document on one line (it took 9.9 GB to read)."""
    span = orjson.dumps(_otlp(1)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]) + b","
    chunk = span * 10_000
    with open(d / "big.json", "wb") as handle:
        handle.write(b'{"resourceSpans":[{"scopeSpans":[{"spans":[')
        for _ in range((1 << 30) // len(chunk)):
            handle.write(chunk)
        handle.write(span[:-1] + b"]}]}]}\n")
    return ["big.json"]


def long_line_among_good(d: Path) -> list[str]:
    good = orjson.dumps(_otlp(50))
    (d / "mixed.jsonl").write_bytes(good + b"\n" + b"[" + b" " * (3 * MiB) + b"]\n" + good + b"\n")
    return ["mixed.jsonl", "--max", "record-bytes=1M"]


def gzip_bomb(d: Path) -> list[str]:
    member = gzip.compress(b" " * (64 * MiB), compresslevel=9)
    (d / "bomb.jsonl.gz").write_bytes(gzip.compress(_lines(HEADER, *_samples(10))) + member * 4)
    return ["bomb.jsonl.gz"]


# name: (builder, exit code, what the output says)
BOUNDS: dict[str, tuple[Callable[[Path], list[str]], int, tuple[str, ...]]] = {
    "snapshot of shared frames": (shared_frames, 0, ("report:",)),
    "snapshot of distinct frame lists": (distinct_frame_lists, 2, ("sites not named", "--max snapshot-frame-bytes")),
    "snapshot of many blocks": (many_blocks, 2, ("first 1,000 were summarised",)),
    "many processes in one file": (many_processes, 2, ("bound of 256 processes", "--max processes")),
    "processes across files": (processes_across_files, 2, ("would pass the bound of 20 processes",)),
    "many records": (many_records, 2, ("bound of 1,000 records", "--max records")),
    "many spans": (many_spans, 2, ("bound of 1,000 spans", "--max spans")),
    "CPU seconds": (cpu_seconds, 2, ("bound of 0.2 CPU seconds", "--max cpu-seconds")),
    "sparse 20 GiB hole": (sparse_hole, 2, ("1 line longer than the record bound", "21,474,836,459 bytes")),
    "1 GB on one line": (one_line_gigabyte, 2, ("JSON document larger than the record bound", "--max record-bytes")),
    "long line among good ones": (long_line_among_good, 2, ("1 line longer than the record bound of 1,048,576 bytes",)),
    "gzip bomb": (gzip_bomb, 2, ("decompressed, it is larger than", "reading stopped there")),
}


@pytest.mark.parametrize("case", sorted(BOUNDS))
def test_a_bound_stops_the_reading_with_a_partial_report(tmp_path: Path, case: str, record_property):
    build, code, messages = BOUNDS[case]
    arguments = build(tmp_path)
    before = tree(tmp_path)
    run = vlmtrace("report", *arguments, "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == code, run.output
    for message in messages:
        assert message in run.output, run.output
    assert changed(before, tree(tmp_path)) <= {"r.html", "s.json"}


# A good journal and one bad file beside it: (file name, content, what the output says about it)
def _journal_line(**fields) -> bytes:
    end = {"k": "end", "t": T0 + 5, "start": T0, "trace_id": "a" * 32, "span_id": "b" * 16, "name": "x", "attrs": {}}
    return _lines(HEADER, {**end, **fields})


BAD_FILES = {
    "OTLP stage as a list": (
        "stage.json",
        orjson.dumps(_otlp(3, [{"key": sc.STAGE, "value": {"arrayValue": {"values": []}}}])),
        "attribute 'vlmtrace.stage' is a list",
    ),
    "Jaeger processID as a list": (
        "jaeger.json",
        orjson.dumps(
            {
                "data": [
                    {
                        "traceID": "a",
                        "processes": {},
                        "spans": [{"traceID": "a", "spanID": "b", "processID": [], "operationName": "x"}],
                    }
                ]
            }
        ),
        "'processID' is a list",
    ),
    "Jaeger v3 scopeSpans as a number": (
        "v3.json",
        orjson.dumps({"result": {"resourceSpans": [{"scopeSpans": 5}]}}),
        "'scopeSpans' is int",
    ),
    "journal span_id as an object": ("span.jsonl", _journal_line(span_id={}), "'span_id' is an object"),
    "journal name as a list": ("name.jsonl", _journal_line(name=[1]), "'name' is a list"),
    "journal stage as an object": (
        "stage.jsonl",
        _journal_line(attrs={sc.STAGE: {}}),
        "attribute 'vlmtrace.stage' is an object",
    ),
    "pickle asking for exabytes": (
        "mem.pickle",
        b"\x80\x04\x8d" + (2**62).to_bytes(8, "little") + b"abc",
        "needs more than 536,870,912 bytes of memory once loaded",
    ),
    "pickle with a 2000-bit size": (
        "big.pickle",
        pickle.dumps({"segments": [{"total_size": 2**2000, "blocks": []}]}),
        "1 snapshot field of the wrong type",
    ),
    "pickle of a class": ("class.pickle", pickle.dumps(Path("/")), "refusing to load"),
    "journal of an unknown version": (
        "v999.jsonl",
        _lines({**HEADER, "v": 999}, *_samples(3)),
        "journal format version 999",
    ),
    "NaN in a plain journal": ("nan.jsonl", _lines(HEADER, *_samples(3)).replace(b"1048576", b"NaN"), "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_one_bad_file_in_a_directory_is_named_and_the_others_are_reported(tmp_path: Path, case: str, record_property):
    name, content, message = BAD_FILES[case]
    runs = tmp_path / "runs"
    runs.mkdir()
    write_journal(LEAK, runs / "good.jsonl")
    (runs / name).write_bytes(content)
    before = tree(tmp_path)
    run = vlmtrace("report", "runs", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 2, run.output
    assert name in run.output and message in run.output, run.output
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    assert summary["leak_found"] and summary["requests_completed"] == LEAK.requests
    assert changed(before, tree(tmp_path)) == {"r.html", "s.json"}


def _slope(directory: Path) -> float:
    (verdict,) = [
        v for v in orjson.loads((directory / "s.json").read_bytes())["verdicts"] if v["component"] == "tensor"
    ]
    return verdict["slope_bytes_per_request"]


def test_repeated_end_records_are_counted_once_and_noted(tmp_path: Path, record_property):
    write_journal(LEAK, tmp_path / "run.jsonl")
    vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path)
    alone = _slope(tmp_path)
    lines = (tmp_path / "run.jsonl").read_bytes().splitlines(keepends=True)
    doubled = b"".join(line + line if b'"k":"end"' in line else line for line in lines)
    (tmp_path / "run.jsonl").write_bytes(doubled)
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    assert "repeating a span id already ended in this file; each span was counted once" in run.output
    assert _slope(tmp_path) == pytest.approx(alone)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_refused_alike_plain_or_gzipped(tmp_path: Path, literal: bytes, record_property):
    write_journal(LEAK, tmp_path / "run.jsonl")
    lines = (tmp_path / "run.jsonl").read_bytes().splitlines(keepends=True)
    ends = [
        index for index, line in enumerate(lines) if b'"k":"end"' in line and b'"vlmtrace.mem.torch.allocated":' in line
    ]
    for index in ends[::7]:
        lines[index] = re.sub(rb'("vlmtrace\.mem\.torch\.allocated":)-?[0-9.eE+]+', rb"\1" + literal, lines[index])
    (tmp_path / "run.jsonl").write_bytes(b"".join(lines))
    (tmp_path / "run.jsonl.gz").write_bytes(gzip.compress(b"".join(lines)))
    results = []
    for name in ("run.jsonl", "run.jsonl.gz"):
        run = vlmtrace("report", name, "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
        results.append((run.code, "not valid JSON" in run.output, round(_slope(tmp_path))))
    assert results[0] == results[1] and results[0][:2] == (2, True)


def _fatal_text(lines: int) -> bytes:
    return (
        b"Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
        + b'  File "x.py", line 1 in f\n' * lines
    )


OUTPUT_FLOODS = {
    "a faulthandler report of 300k lines": (
        lambda: _lines(HEADER, *_samples(20)) + _fatal_text(300_000),
        "more lines not kept",
    ),
    "a hundred faulthandler reports": (
        lambda: _lines(HEADER) + b"".join(_lines(*_samples(1)) + _fatal_text(10) for _ in range(100)),
        "the later ones are not kept",
    ),
    "200k warning records": (
        lambda: _lines(
            HEADER,
            *_samples(20),
            *({"k": "warning", "t": T0, "source": "probe", "message": "m" * 50} for _ in range(200_000)),
        ),
        "more warning records",
    ),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_FLOODS))
def test_what_a_report_copies_from_its_input_is_bounded(tmp_path: Path, case: str, record_property):
    content, cut = OUTPUT_FLOODS[case]
    (tmp_path / "flood.jsonl").write_bytes(content())
    run = vlmtrace("report", "flood.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code in (0, 2), run.output
    assert (tmp_path / "s.json").stat().st_size < 4 * MiB and (tmp_path / "r.html").stat().st_size < 8 * MiB
    assert cut in (tmp_path / "s.json").read_text()
