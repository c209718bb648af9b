"""Journal files: naming, rotation, retention, one file per process, and what happens when writing fails."""

from __future__ import annotations

import logging
import os
import re
import socket

from tests.export.child_process import start_python
from tests.export.journal_lines import journal_files, of_kind, read_journal_file, records_of
from vlmtrace.export.journal import JournalWriter

RESOURCE = {"service.name": "lmdeploy"}


def open_writer(target, **overrides) -> JournalWriter:
    settings = {"max_bytes": 64 * 1024 * 1024, "max_files": 8, "resource": RESOURCE, "versions": {}}
    settings.update(overrides)
    writer = JournalWriter.open(str(target), **settings)
    assert writer is not None
    return writer


def fill(writer: JournalWriter, records: int) -> None:
    for i in range(records):
        writer.write_sample(i, {"i": i, "pad": "x" * 200})


def test_a_directory_target_is_created_and_holds_one_file_per_process(tmp_path):
    target = tmp_path / "nested" / "journal"
    writer = open_writer(target)
    writer.close()

    (name,) = os.listdir(target)
    match = re.fullmatch(r"vlmtrace-(.+)-(\d+)-(\d+)\.0\.jsonl", name)
    assert match is not None
    assert match[1] == socket.gethostname()
    assert int(match[2]) == os.getpid()
    assert writer.path == str(target / name)


def test_a_jsonl_target_is_the_file_itself_and_rotates_to_numbered_siblings(tmp_path):
    target = tmp_path / "run.jsonl"
    writer = open_writer(target, max_bytes=4096, max_files=100)
    assert writer.path == str(target)
    fill(writer, 60)
    writer.close()

    files = sorted(os.listdir(tmp_path), key=lambda n: int(n.rsplit(".", 1)[1]) if n[-1].isdigit() else 0)
    assert files[0] == "run.jsonl"
    assert files[1:] == [f"run.jsonl.{n}" for n in range(1, len(files))]
    assert len(files) >= 3
    for seq, name in enumerate(files):
        records, rest = read_journal_file(tmp_path / name)
        assert rest == ""
        assert records[0]["k"] == "header" and records[0]["seq"] == seq
        assert os.path.getsize(tmp_path / name) < 4096 + 400  # rotation happens on the record that passes the limit
    assert writer.path == str(tmp_path / files[-1])


def test_rotation_keeps_at_most_max_files_and_only_the_newest(tmp_path):
    writer = open_writer(tmp_path / "j", max_bytes=4096, max_files=3)
    fill(writer, 300)
    writer.close()

    files = journal_files(tmp_path / "j")
    assert len(files) == 3
    seqs = [read_journal_file(path)[0][0]["seq"] for path in files]
    assert seqs == list(range(seqs[0], seqs[0] + 3))
    assert seqs[0] > 10
    assert files[-1] == writer.path
    assert of_kind(records_of(tmp_path / "j"), "sample")[-1]["attrs"]["i"] == 299


def test_an_existing_jsonl_file_is_appended_to_with_a_new_header(tmp_path):
    target = tmp_path / "run.jsonl"
    for _ in range(2):
        writer = open_writer(target)
        writer.write_sample(1, {})
        writer.close()

    records, _ = read_journal_file(target)
    assert [r["k"] for r in records] == ["header", "sample", "end_marker"] * 2


def test_a_jsonl_target_held_by_another_live_process_gets_a_file_of_its_own(tmp_path):
    target = tmp_path / "shared.jsonl"
    holder = start_python(
        "-c",
        "import sys, time; from vlmtrace.export.journal import JournalWriter; "
        "w = JournalWriter.open(sys.argv[1], max_bytes=1 << 20, max_files=2, resource={}, versions={}); "
        "print(w.path, flush=True); time.sleep(60)",
        str(target),
    )
    try:
        assert holder.stdout.readline().strip() == str(target)
        writer = open_writer(target)
        assert writer.path == str(tmp_path / f"shared-{os.getpid()}.jsonl")
        writer.close()
    finally:
        holder.kill()
        holder.wait()
    writer = open_writer(target)  # the holder died: its lock went with it
    assert writer.path == str(target)
    writer.close()


def test_a_forked_child_writes_its_own_file_and_never_the_parents(tmp_path):
    writer = open_writer(tmp_path / "j")
    writer.write_sample(1, {"who": "parent"})
    pid = os.fork()
    if pid == 0:  # the child: exit without running pytest's teardown
        try:
            writer.write_sample(2, {"who": "child"})
            writer.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    writer.write_sample(3, {"who": "parent"})
    writer.close()

    by_pid = {}
    for path in journal_files(tmp_path / "j"):
        records, rest = read_journal_file(path)
        assert rest == ""
        by_pid[records[0]["pid"]] = records
    assert set(by_pid) == {os.getpid(), pid}
    assert [r["attrs"]["who"] for r in of_kind(by_pid[os.getpid()], "sample")] == ["parent", "parent"]
    child = by_pid[pid]
    assert child[0]["ppid"] == os.getpid()
    assert [r["attrs"]["who"] for r in of_kind(child, "sample")] == ["child"]
    assert child[-1]["k"] == "end_marker"


def test_an_unwritable_target_gives_one_warning_and_no_writer(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")

    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        writer = JournalWriter.open(str(blocker / "journal"), max_bytes=4096, max_files=1, resource={}, versions={})

    assert writer is None
    warnings = [r for r in caplog.records if r.name == "vlmtrace"]
    assert len(warnings) == 1
    assert str(blocker / "journal") in warnings[0].getMessage()
    assert "continues without" in warnings[0].getMessage()


def test_a_disk_that_fails_writes_gives_one_warning_and_no_exception(tmp_path, caplog):
    target = tmp_path / "full.jsonl"
    os.symlink("/dev/full", target)  # every write fails with ENOSPC

    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        writer = JournalWriter.open(str(target), max_bytes=4096, max_files=1, resource={}, versions={})
        assert writer is None  # the header could not be written
        writer = open_writer(tmp_path / "ok.jsonl")
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, writer._fd)  # the disk fills up under a running writer
        os.close(full)
        for i in range(100):
            writer.write_sample(i, {})
        writer.close()

    messages = [r.getMessage() for r in caplog.records if r.name == "vlmtrace"]
    assert len(messages) == 2
    assert "cannot write the journal" in messages[0]
    assert "failed" in messages[1] and "lost" in messages[1]


def test_a_relative_target_stays_where_it_was_when_the_process_changes_directory(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    writer = open_writer("vlmtrace-journal", max_bytes=4096, max_files=100)
    monkeypatch.chdir(tmp_path / "elsewhere")
    fill(writer, 60)
    writer.close()

    assert len(journal_files(tmp_path / "vlmtrace-journal")) >= 3
    assert list((tmp_path / "elsewhere").iterdir()) == []
