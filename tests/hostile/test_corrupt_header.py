"""`vlmtrace report` on journals whose first line, the header, is torn, overwritten or not an object:
the records after it are read, the bad line is named, and the process is taken from the file's name
where the writer named it (`vlmtrace-HOST-PID-START.N.jsonl`), so a rotated file still joins its process."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from tests.hostile.test_reading import LEAK

WRITER_NAME = "vlmtrace-node1-4242-1760000000.0.jsonl"

HEADERS = {
    "torn mid-record": b'{"k":"header","v":2,"pid":42',
    "overwritten by binary garbage": b"\x00\x01\xfe\xff garbage",
    "zero bytes": b"\x00" * 64,
    "a JSON list": b"[1, 2, 3]",
    "a JSON number": b"7",
    "text": b"lmdeploy serve api_server ./model",
}


def _journal_with_header(directory: Path, name: str, header: bytes) -> None:
    write_journal(LEAK, directory / "good.jsonl")
    lines = (directory / "good.jsonl").read_bytes().splitlines(keepends=True)
    (directory / "good.jsonl").unlink()
    (directory / name).write_bytes(header + b"\n" + b"".join(lines[1:]))


@pytest.mark.parametrize("name", [WRITER_NAME, "run.jsonl"], ids=["writer's file name", "another name"])
@pytest.mark.parametrize("case", sorted(HEADERS))
def test_the_records_after_a_bad_header_are_read(tmp_path: Path, case: str, name: str, record_property):
    _journal_with_header(tmp_path, name, HEADERS[case])
    before = tree(tmp_path)
    run = vlmtrace("report", name, "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    assert summary["leak_found"] and summary["requests_completed"] == LEAK.requests, run.output
    assert case == "zero bytes" or f"{name}:1" in run.output, (
        run.output
    )  # zero bytes: a writer that died before its header
    (process,) = summary["processes"]
    assert process["process"] == ("node1:4242" if name == WRITER_NAME else name), process
    assert changed(before, tree(tmp_path)) == {"r.html", "s.json"}


def test_a_rotated_file_with_a_bad_header_joins_its_process(tmp_path: Path, record_property):
    write_journal(LEAK, tmp_path / "all.jsonl")
    lines = (tmp_path / "all.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "all.jsonl").unlink()
    header = orjson.loads(lines[0])
    header.update(host="node1", pid=4242)
    half = len(lines) // 2
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "vlmtrace-node1-4242-1760000000.0.jsonl").write_bytes(
        orjson.dumps(header) + b"\n" + b"".join(lines[1:half])
    )
    (runs / "vlmtrace-node1-4242-1760000000.1.jsonl").write_bytes(b'{"k":"head\n' + b"".join(lines[half:]))
    run = vlmtrace("report", "runs", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    assert [process["process"] for process in summary["processes"]] == ["node1:4242"], run.output
    assert summary["requests_completed"] == LEAK.requests
    assert "process taken from the file name (host node1, pid 4242)" in str(summary["problems"]), summary["problems"]
