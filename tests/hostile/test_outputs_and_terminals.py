"""What a hostile run may not do to its surroundings: replace a device, a FIFO or a symbolic link named as
an output, overwrite one output with the other, leave or show a temporary file, or drive the terminal
with escape sequences carried by names in its input (`report`, `diff`, `top`)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import MiB, Scenario, write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.analysis.readers import parallel

NS = 10**9
T0 = 1_760_000_000 * NS
LEAK = Scenario(requests=40, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM})
ESCAPES = ["\x1b]52;c;SGVsbG8=\x07", "\x1b]0;pwned\x07", "\x1b[2J", "\x9b31m", "\x07\x08\r"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    write_journal(LEAK, tmp_path / "run.jsonl")
    return tmp_path


def test_dev_null_as_both_outputs_stays_a_device(run_dir: Path, record_property):
    before = os.stat("/dev/null")
    run = vlmtrace("report", "run.jsonl", "-o", "/dev/null", "--json", "/dev/null", cwd=run_dir, record=record_property)
    assert run.code == 0, run.output
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_a_symbolic_link_is_written_through(run_dir: Path, record_property):
    (run_dir / "reports").mkdir()
    (run_dir / "link.html").symlink_to("reports/target.html")
    (run_dir / "summary.json").symlink_to("reports/summary.json")
    before = tree(run_dir)
    run = vlmtrace(
        "report", "run.jsonl", "-o", "link.html", "--json", "summary.json", cwd=run_dir, record=record_property
    )
    assert run.code == 0, run.output
    assert (run_dir / "link.html").is_symlink() and os.readlink(run_dir / "link.html") == "reports/target.html"
    assert b"vlmtrace" in (run_dir / "reports" / "target.html").read_bytes()
    assert orjson.loads((run_dir / "reports" / "summary.json").read_bytes())["leak_found"]
    assert changed(before, tree(run_dir)) == {"reports", "reports/target.html", "reports/summary.json"}


def test_a_fifo_is_written_in_place_when_read_and_refused_when_not(run_dir: Path, record_property):
    fifo = run_dir / "pipe.html"
    os.mkfifo(fifo)
    before = tree(run_dir)
    refused = vlmtrace("report", "run.jsonl", "-o", "pipe.html", cwd=run_dir, record=record_property)
    assert refused.code == 2 and "a FIFO that nothing reads" in refused.output and "pipe.html" in refused.output
    assert changed(before, tree(run_dir)) == set()
    with open(run_dir.parent / f"{run_dir.name}-read.html", "wb") as received:
        reader = subprocess.Popen(["cat", str(fifo)], stdout=received)
        run = vlmtrace("report", "run.jsonl", "-o", "pipe.html", cwd=run_dir)
        assert reader.wait(timeout=60) == 0
    assert run.code == 0, run.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert b"vlmtrace" in (run_dir.parent / f"{run_dir.name}-read.html").read_bytes()


@pytest.mark.parametrize(
    "outputs", [("same.html", "same.html"), ("same.html", "./same.html"), ("a.html", "alias.json")]
)
def test_both_outputs_on_one_file_are_refused(run_dir: Path, outputs: tuple[str, str], record_property):
    (run_dir / "a.html").write_text("kept")
    (run_dir / "alias.json").symlink_to("a.html")
    before = tree(run_dir)
    run = vlmtrace("report", "run.jsonl", "-o", outputs[0], "--json", outputs[1], cwd=run_dir, record=record_property)
    assert run.code == 2 and "-o and --json name the same file" in run.output, run.output
    assert changed(before, tree(run_dir)) == set() and (run_dir / "a.html").read_text() == "kept"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("/nonexistent/dir/r.html", "No such file or directory: '/nonexistent/dir/r.html'"),
        ("adir", "a directory, not a file"),
    ],
)
def test_an_output_that_cannot_be_written_is_named_as_given(run_dir: Path, target: str, message: str, record_property):
    (run_dir / "adir").mkdir()
    before = tree(run_dir)
    run = vlmtrace("report", "run.jsonl", "-o", target, cwd=run_dir, record=record_property)
    assert run.code == 2 and message in run.output, run.output
    assert ".partial" not in run.output and "vlmtrace-" not in run.output
    assert changed(before, tree(run_dir)) == set()


def test_a_killed_reports_temporary_file_is_removed_by_the_next_report(run_dir: Path, record_property):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = run_dir / f".r.html.vlmtrace-{dead.pid}-x1.partial"
    live = run_dir / f".r.html.vlmtrace-{os.getpid()}-x2.partial"  # another report, still writing
    stale.write_bytes(b"<html>half")
    live.write_bytes(b"<html>half")
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", cwd=run_dir, record=record_property)
    assert run.code == 0, run.output
    assert not stale.exists() and live.exists()
    assert sorted(path.name for path in run_dir.iterdir()) == sorted([live.name, "r.html", "run.jsonl"])


def test_escape_sequences_in_file_names_reach_the_terminal_escaped(run_dir: Path, record_property):
    for index, escape in enumerate(ESCAPES):
        (run_dir / f"{escape}bad{index}.json").write_bytes(b"not json")
    run = vlmtrace(
        "report",
        "run.jsonl",
        *[f"{escape}bad{index}.json" for index, escape in enumerate(ESCAPES)],
        "-o",
        "r.html",
        cwd=run_dir,
        record=record_property,
    )
    assert run.code == 2, run.output
    assert not any(character in run.stdout + run.stderr for character in "\x1b\x07\x08\x9b")
    assert "\\x1b]52;c;SGVsbG8=\\x07bad0.json" in run.output and "\\x9b31mbad3.json" in run.output


def _live_journal(directory: Path, host: str, name: str, pid: int, span_id: object = "b" * 16) -> None:
    """A journal being written: a header, two spans started, a sample; the header's pid and the sample's
    reading as given, however large (JSON has no bound on integers)."""
    header = {"k": "header", "v": 2, "t": T0, "pid": "PID", "host": host, "resource": {"service.name": name}}
    start = {
        "k": "start",
        "t": T0 + 1,
        "trace_id": "a" * 32,
        "span_id": span_id,
        "name": name,
        "attrs": {sc.STAGE: name},
    }
    other = {
        "k": "start",
        "t": T0 + 2,
        "trace_id": "a" * 32,
        "span_id": "c" * 16,
        "name": name,
        "attrs": {sc.STAGE: name},
    }
    end = {
        "k": "end",
        "t": T0 + 3,
        "start": T0 + 1,
        "trace_id": "a" * 32,
        "span_id": span_id,
        "name": name,
        "attrs": {},
    }
    sample = {"k": "sample", "t": T0 + 3, "attrs": {sc.MEM_TORCH_ALLOCATED: "HUGE"}}
    text = b"\n".join(orjson.dumps(record) for record in (header, start, other, end, sample)) + b"\n"
    text = text.replace(b'"PID"', str(pid).encode()).replace(b'"HUGE"', str(2**2000).encode())
    (directory / f"vlmtrace-{host}-{pid}-1.jsonl").write_bytes(text)


@pytest.mark.parametrize(
    ("host", "pid"), [(socket.gethostname(), 2**31), (socket.gethostname(), 2**70), ("\x1b]0;pwned\x07", os.getpid())]
)
def test_top_shows_names_with_escapes_escaped_and_bears_odd_fields(
    tmp_path: Path, host: str, pid: int, record_property
):
    """A pid past a C int (this host's: the follower would signal it), an end record whose span id is a
    list, a reading of 2,000 bits, and escape sequences in the host, service and span names."""
    journal = tmp_path / "journal"
    journal.mkdir()
    _live_journal(journal, host, "\x1b]52;c;SGVsbG8=\x07\x1b[2J", pid, span_id=["x"])
    before = tree(tmp_path)
    run = vlmtrace("top", "journal", "--once", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    assert not any(character in run.stdout + run.stderr for character in "\x1b\x07")
    assert "\\x1b]52;c;SGVsbG8=\\x07\\x1b[2J" in run.output
    assert changed(before, tree(tmp_path)) == set()


def test_top_bears_a_line_longer_than_any_record(tmp_path: Path, record_property):
    journal = tmp_path / "journal"
    journal.mkdir()
    _live_journal(journal, "h", "request", os.getpid())
    path = next(journal.iterdir())
    with open(path, "ab") as handle:
        handle.write(b"{" + b" " * (40 * MiB) + b"\n")
        handle.write(orjson.dumps({"k": "sample", "t": T0 + 9, "attrs": {sc.MEM_TORCH_ALLOCATED: 3 * MiB}}) + b"\n")
    run = vlmtrace("top", "journal", "--once", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output


def _idle_run(path: Path) -> None:
    header = {"k": "header", "v": 2, "t": T0, "pid": 9, "host": "h"}
    samples = [{"k": "sample", "t": T0 + i * NS, "attrs": {sc.MEM_TORCH_ALLOCATED: MiB}} for i in range(20)]
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in (header, *samples)))


@pytest.mark.parametrize("flags", [[], ["--fail-on-regression"]])
@pytest.mark.parametrize("empty", ["before", "after"])
def test_diff_with_a_run_without_requests_exits_2_with_the_reason(
    run_dir: Path, flags: list[str], empty: str, record_property
):
    _idle_run(run_dir / "idle.jsonl")
    runs = ["idle.jsonl", "run.jsonl"] if empty == "before" else ["run.jsonl", "idle.jsonl"]
    before = tree(run_dir)
    run = vlmtrace("diff", *runs, "-o", "d.html", "--json", "d.json", *flags, cwd=run_dir, record=record_property)
    assert run.code == 2, run.output
    assert f"nothing to compare: the {empty} run completed no requests" in run.output
    assert changed(before, tree(run_dir)) == set()


def test_reading_processes_never_outnumber_the_cores(monkeypatch):
    monkeypatch.setenv(parallel.PROCESSES_VARIABLE, "100000")
    assert parallel.worker_count(10**6) == (os.cpu_count() or 1)
    monkeypatch.setenv(parallel.PROCESSES_VARIABLE, "1")
    assert parallel.worker_count(10**6) == 1
