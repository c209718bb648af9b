"""`vlmtrace report` on inputs whose cost grew with what it threw away: thousands of one-process journal
files past the bound on processes (left out before they are read, one problem counting them), and
hundreds of thousands of records of no journal kind (a file of little else is not read on; a stray
record in a good journal is skipped and named). Each is measured by what was read and left out, never
by its wall time."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from tests.hostile.test_reading import HEADER, LEAK, T0, _lines, _samples

FILES = 3000
KEPT = 32  # --max processes: what is kept is small, so the case costs what is left out, if anything
FIFOS = 10  # the last files past the bound are named pipes: opening one would wait for a writer forever
DEAD = 2**22 + 1  # above Linux's largest pid: no such process


def _one_process_files(journal: Path, writer_names: bool) -> None:
    journal.mkdir()
    for index in range(FILES):
        pid = DEAD + index
        name = f"vlmtrace-elsewhere-{pid}-1.0.jsonl" if writer_names else f"p{index:05d}.jsonl"
        if writer_names and index >= FILES - FIFOS:
            os.mkfifo(journal / name)
            continue
        header = {**HEADER, "pid": pid, "host": "elsewhere"}
        (journal / name).write_bytes(_lines(header, *({**sample, "t": T0 + index} for sample in _samples(1))))


def _summary(directory: Path) -> dict:
    return orjson.loads((directory / "s.json").read_bytes())


@pytest.mark.parametrize("writer_names", [True, False], ids=["named by their writer", "named otherwise"])
def test_files_past_the_bound_on_processes_are_left_out_unread_and_counted(
    tmp_path: Path, writer_names: bool, record_property
):
    _one_process_files(tmp_path / "journal", writer_names)
    before = tree(tmp_path)
    arguments = ["journal", "--max", f"processes={KEPT}", "-o", "r.html", "--json", "s.json"]
    run = vlmtrace("report", *arguments, cwd=tmp_path, record=record_property)
    assert run.code == 2, run.output
    summary = _summary(tmp_path)
    assert len(summary["processes"]) == KEPT and len(summary["inputs"]) == KEPT
    (left_out,) = [problem for problem in summary["problems"] if "bound of" in problem["reason"]]
    assert left_out["reason"].startswith(f"{FILES - KEPT:,} files not read"), left_out
    assert f"bound of {KEPT} processes" in left_out["reason"] and "--max processes" in left_out["reason"]
    assert f"{FILES - KEPT:,} files not read" in run.output
    # Not opened at all: a named pipe among them would be reported as one, or block the reading.
    assert not any("FIFO" in problem["reason"] for problem in summary["problems"]), summary["problems"]
    assert changed(before, tree(tmp_path)) == {"r.html", "s.json"}


def _records_of_no_kind(path: Path, count: int, header: bool) -> None:
    with open(path, "wb") as handle:
        if header:
            handle.write(_lines(HEADER))
        handle.write(b"{}\n" * count)


@pytest.mark.parametrize(
    ("header", "where", "words"),
    [
        (True, "line 10,001", "10,000 records of no journal kind"),
        (False, "line 10,000", "not a trace format this analyzer knows: reading stopped"),
    ],
    ids=["after a journal header", "alone"],
)
def test_a_file_of_records_of_no_kind_is_not_read_past_ten_thousand(
    tmp_path: Path, header: bool, where: str, words: str, record_property
):
    _records_of_no_kind(tmp_path / "empty.jsonl", 300_000, header)
    before = tree(tmp_path)
    run = vlmtrace("report", "empty.jsonl", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 2, run.output
    assert f"reading stopped at {where}" in run.output and words in run.output, run.output
    assert changed(before, tree(tmp_path)) == set()  # nothing to analyse: no summary written


def test_a_good_journal_followed_by_records_of_no_kind_keeps_what_came_before(tmp_path: Path, record_property):
    write_journal(LEAK, tmp_path / "run.jsonl")
    with open(tmp_path / "run.jsonl", "ab") as handle:
        handle.write(b'{"k":"later"}\n' * 400_000)
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 2, run.output
    summary = _summary(tmp_path)
    assert summary["requests_completed"] == LEAK.requests and summary["leak_found"]
    (stop,) = [problem for problem in summary["problems"] if "reading stopped" in problem["reason"]]
    assert "records of no journal kind, 99 in 100 of the lines read" in stop["reason"]
    stopped_at = int(stop["reason"].split("line ")[1].split(":")[0].replace(",", ""))
    assert stopped_at < 400_000  # the rest of the file was not read


def test_stray_records_in_a_good_journal_are_skipped_the_first_named_the_rest_counted(tmp_path: Path, record_property):
    write_journal(LEAK, tmp_path / "good.jsonl")
    lines = (tmp_path / "good.jsonl").read_bytes().splitlines(keepends=True)
    strays = [b'{"k":"newer-kind-%d"}\n' % index for index in range(500)]
    (tmp_path / "run.jsonl").write_bytes(b"".join([lines[0], *strays, *lines[1:]]))
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    summary = _summary(tmp_path)
    assert summary["requests_completed"] == LEAK.requests and summary["leak_found"]
    named = [problem for problem in summary["problems"] if "unknown journal record kind" in problem["reason"]]
    assert len(named) == 20 and named[0]["line"] == 2 and "'newer-kind-0'" in named[0]["reason"]
    assert any(
        problem["reason"] == "480 more records of no journal kind skipped (not listed)"
        for problem in summary["problems"]
    )
