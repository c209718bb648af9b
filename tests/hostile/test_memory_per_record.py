"""`vlmtrace report` on journals whose records are cheap to write and were costly to keep: minimal
sample lines, start records that never end, samples naming thousands of devices. What is not kept is
counted, and peak memory follows what is kept (the inputs here are small; benchmarks/hostile_memory.py
runs the large ones)."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from tests.hostile.cli import GiB, changed, tree, vlmtrace
from tests.hostile.test_reading import HEADER, T0, _lines
from vlmtrace import semconv as sc

MiB = 1 << 20
KEPT_LITTLE_BYTES = (
    GiB // 2
)  # the bound for inputs of which little is kept: the interpreter and its libraries, and room


def _repeated(line: bytes, total: int) -> bytes:
    return _lines(HEADER) + line * (total // len(line))


def _start(index: int) -> dict:
    return {
        "k": "start",
        "t": T0 + index,
        "trace_id": "a" * 32,
        "span_id": f"{index + 1:016x}",
        "parent_id": None,
        "name": "request",
        "kind": "INTERNAL",
        "thread": "main",
        "attrs": {sc.STAGE: sc.STAGE_REQUEST},
        "mem": {},
        "links": [],
    }


def _end(index: int) -> dict:
    return {
        "k": "end",
        "t": T0 + index + 5,
        "start": T0 + index,
        "trace_id": "a" * 32,
        "span_id": f"{index + 1:016x}",
        "name": "request",
        "status": "OK",
        "attrs": {sc.STAGE: sc.STAGE_REQUEST},
        "mem": {sc.MEM_TORCH_ALLOCATED: MiB},
    }


def _devices(count: int) -> dict:
    return {
        "k": "sample",
        "t": T0,
        "attrs": {
            sc.MEM_DEVICES: list(range(count)),
            sc.MEM_TORCH_ALLOCATED: MiB,
            sc.MEM_TORCH_ALLOCATED + sc.PER_DEVICE_SUFFIX: [MiB] * count,
        },
    }


# name: (file name, content, extra arguments, what the output says, whether the summary says so in `inputs`)
CASES = {
    "16 MiB of samples without a reading": (
        "empty.jsonl",
        lambda: _repeated(b'{"k":"sample"}\n', 16 * MiB),
        (),
        "1,118,481 sample records without a memory reading; not kept",
    ),
    "the same, gzipped": (
        "empty.jsonl.gz",
        lambda: gzip.compress(_repeated(b'{"k":"sample"}\n', 16 * MiB), 1),
        (),
        "1,118,481 sample records without a memory reading; not kept",
    ),
    "samples of one reading past the samples bound": (
        "one.jsonl",
        lambda: _repeated(orjson.dumps({"k": "sample", "t": T0, "attrs": {sc.MEM_HOST_RSS: 1}}) + b"\n", 8 * MiB),
        ("--max", "samples=50k"),
        "bound of 51,200 memory samples",
    ),
    "100k start records that never end": (
        "starts.jsonl",
        lambda: _lines(HEADER, *map(_start, range(100_000))),
        (),
        "80,000 start records let go unended",
    ),
    "starts let go, then their ends": (
        "ends.jsonl.gz",
        lambda: gzip.compress(_lines(HEADER, *map(_start, range(30_000)), *map(_end, range(30_000))), 1),
        (),
        "10,000 start records let go unended",
    ),
    "8 samples naming 100k devices": (
        "devices.jsonl",
        lambda: _lines(HEADER, *[_devices(100_000)] * 8),
        (),
        "799,488 per-device readings past the first 64 devices",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_a_journal_costs_follows_what_is_kept(tmp_path: Path, case: str, record_property):
    name, content, arguments, message = CASES[case]
    (tmp_path / name).write_bytes(content())
    before = tree(tmp_path)
    run = vlmtrace("report", name, *arguments, "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert message in run.output, run.output
    assert run.peak_rss_bytes < KEPT_LITTLE_BYTES, run.peak_rss_bytes >> 20
    assert changed(before, tree(tmp_path)) <= {"r.html", "s.json"}


def test_ended_spans_whose_start_was_let_go_are_still_counted(tmp_path: Path, record_property):
    (tmp_path / "ends.jsonl").write_bytes(_lines(HEADER, *map(_start, range(30_000)), *map(_end, range(30_000))))
    run = vlmtrace("report", "ends.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    assert run.code == 0 and summary["spans_ended"] == 30_000 and not summary["in_flight"], run.output


def test_a_file_of_many_short_lines_is_read_alike_plain_and_gzipped(tmp_path: Path, record_property):
    """More lines than the columnar reader takes at once: the line reader reads the plain file, as it does the gzipped one."""
    samples = [{"k": "sample", "t": T0 + i, "attrs": {sc.MEM_TORCH_ALLOCATED: MiB + i}} for i in range(250_000)]
    content = _lines(HEADER, *samples)
    (tmp_path / "short.jsonl").write_bytes(content)
    (tmp_path / "short.jsonl.gz").write_bytes(gzip.compress(content, 1))
    counts = []
    for name in ("short.jsonl", "short.jsonl.gz"):
        run = vlmtrace("report", name, "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
        assert run.code == 0, run.output
        counts.append([read["samples"] for read in orjson.loads((tmp_path / "s.json").read_bytes())["inputs"]])
    assert counts == [[250_000], [250_000]]
