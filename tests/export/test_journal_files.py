"""Journal files: naming, rotation, retention, one file per process, and what happens when writing fails."""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import subprocess
import time

import pytest

from tests.export.child_process import start_python
from tests.export.journal_lines import journal_files, of_kind, read_journal_file, records_of
from vlmtrace.analysis.readers.journal import read_journal
from vlmtrace.export.journal import JournalWriter
from vlmtrace.export.journal.files import FileNames

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
    writer = open_writer(target, max_bytes=16384, max_files=100)
    assert writer.path == str(target)
    fill(writer, 300)
    writer.close()

    files = sorted(os.listdir(tmp_path), key=lambda n: int(n.rsplit(".", 1)[1]) if n[-1].isdigit() else 0)
    assert files[0] == "run.jsonl"
    assert files[1:] == [f"run.jsonl.{n}" for n in range(1, len(files))]
    assert len(files) >= 3
    for seq, name in enumerate(files):
        records, rest = read_journal_file(tmp_path / name)
        assert rest == ""
        assert records[0]["k"] == "header" and records[0]["seq"] == seq
        assert os.path.getsize(tmp_path / name) < 16384 + 400  # rotation happens on the record that passes the limit
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
    warnings = [r for r in caplog.records if r.name.startswith("vlmtrace.export.journal")]
    assert len(warnings) == 1
    assert str(blocker / "journal") in warnings[0].getMessage()
    assert "continues without" in warnings[0].getMessage()


def test_a_journal_path_with_escape_sequences_is_warned_of_escaped(tmp_path, caplog):
    """VLMTRACE_JOURNAL is the environment's text: the warning shows it, never hands it to a terminal."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        writer = JournalWriter.open(
            str(blocker / "\x1b]0;pwned\x07\u202ej"), max_bytes=4096, max_files=1, resource={}, versions={}
        )
    assert writer is None
    (warning,) = [r.getMessage() for r in caplog.records if r.name.startswith("vlmtrace.export.journal")]
    assert "\\x1b]0;pwned\\x07\\u202ej" in warning and not any(c in warning for c in "\x1b\x07\u202e")


def test_a_symbolic_link_at_the_journal_name_is_not_followed(tmp_path, caplog):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "run.jsonl").symlink_to(victim)

    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        writer = JournalWriter.open(str(tmp_path / "run.jsonl"), max_bytes=4096, max_files=1, resource={}, versions={})

    assert writer is None
    assert victim.read_text() == "precious"
    (warning,) = [r.getMessage() for r in caplog.records if r.name.startswith("vlmtrace.export.journal")]
    assert "symbolic link" in warning and "continues without" in warning


def test_a_name_planted_in_a_journal_directory_is_never_written(tmp_path):
    directory = tmp_path / "j"
    directory.mkdir()
    planted = tmp_path / "planted.txt"
    planted.write_text("theirs")
    now = int(time.time())
    guessed = [FileNames(str(directory), os.getpid(), now + s).path(0) for s in (0, 1)]  # the name, this second or next
    for name in guessed:
        os.symlink(planted, name)

    writer = open_writer(directory)
    writer.write_sample(1, {})
    writer.close()

    assert planted.read_text() == "theirs"
    assert writer.path not in guessed and os.path.dirname(writer.path) == str(directory)
    assert of_kind(read_journal_file(writer.path)[0], "sample") != []


def test_files_and_directories_are_owner_only_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        writer = open_writer(tmp_path / "new" / "nested" / "journal", max_bytes=4096)
        fill(writer, 40)  # rotated files too
        writer.close()
        file_writer = open_writer(tmp_path / "made" / "run.jsonl")
        file_writer.close()
    finally:
        os.umask(previous)

    files = [*journal_files(tmp_path / "new" / "nested" / "journal"), str(tmp_path / "made" / "run.jsonl")]
    assert len(files) > 2
    assert {stat.S_IMODE(os.stat(path).st_mode) for path in files} == {0o600}
    directories = ["new", "new/nested", "new/nested/journal", "made"]
    assert {stat.S_IMODE(os.stat(tmp_path / d).st_mode) for d in directories} == {0o700}


@pytest.fixture(params=["256k", "2m"])
def full_filesystem(request, tmp_path):
    """A real small file system (tmpfs), so the journal meets ENOSPC where it reserves space."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={request.param}", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mountpoint, int(request.param[:-1]) << (10 if request.param.endswith("k") else 20)
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def test_a_full_disk_ends_the_journal_cleanly_with_a_count_of_what_was_dropped(full_filesystem, caplog):
    mountpoint, size = full_filesystem
    attempts = 2 * size // 200  # twice what fits
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        writer = open_writer(mountpoint / "j", max_bytes=256 * 1024, max_files=100)  # rotates on the 2 MiB one
        for i in range(attempts):
            writer.write_sample(i, {"i": i, "pad": "x" * 200})
        writer.close()

    messages = [r.getMessage() for r in caplog.records if r.name.startswith("vlmtrace.export.journal")]
    assert len(messages) == 1 and "no space left" in messages[0]
    assert_ended_cleanly_at_the_full_disk(mountpoint / "j", attempts)


def test_a_file_size_limit_ends_the_journal_the_same_way(tmp_path):
    """RLIMIT_FSIZE: the same end without root (the writer meets EFBIG where it reserves space)."""
    attempts = 3000
    child = start_python(
        "-c",
        """if True:
        import resource, signal, sys
        from vlmtrace.export.journal import JournalWriter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the limit then fails the call instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        writer = JournalWriter.open(sys.argv[1], max_bytes=64 << 20, max_files=2, resource={}, versions={})
        for i in range(int(sys.argv[2])):
            writer.write_sample(i, {"i": i, "pad": "x" * 200})
        writer.close()
        """,
        str(tmp_path / "j"),
        str(attempts),
    )
    _, stderr = child.communicate(timeout=60)

    assert child.returncode == 0, stderr
    assert stderr.count("no space left") == 1
    assert_ended_cleanly_at_the_full_disk(tmp_path / "j", attempts)


def assert_ended_cleanly_at_the_full_disk(directory, attempts: int) -> None:
    records = records_of(directory)  # fails on any torn line or stray bytes
    written = len(of_kind(records, "sample"))
    assert written > 100
    assert [r["k"] for r in records[-3:]] == ["disk_full", "dropped", "end_marker"]
    assert records[-2]["journal_records"] == attempts - written
    assert records[-1]["clean"] is True
    assert [s["attrs"]["i"] for s in of_kind(records, "sample")] == list(range(written))

    data = read_journal([directory])
    # the test's samples carry no memory reading: counted in one note, not kept; nothing else is wrong
    assert [p for p in data.problems if "without a memory reading" not in str(p)] == []
    assert data.processes[0].clean_end
    assert data.dropped["journal_records"] == attempts - written
    assert any("file system was full" in w["message"] for w in data.warnings)


def test_a_relative_target_stays_where_it_was_when_the_process_changes_directory(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    writer = open_writer("vlmtrace-journal", max_bytes=4096, max_files=100)
    monkeypatch.chdir(tmp_path / "elsewhere")
    fill(writer, 60)
    writer.close()

    assert len(journal_files(tmp_path / "vlmtrace-journal")) >= 3
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_directory_that_turns_read_only_stops_the_journal_at_its_bound_with_one_warning(tmp_path):
    """Rotation cannot open a next file: the current one never grows past max_bytes (by more than the
    record that crossed it), what follows is counted in the `dropped` record, and one warning says so."""
    attempts, max_bytes = 2000, 16 * 1024
    child = start_python(
        "-c",
        """if True:
        import os, sys
        from vlmtrace.export.journal import JournalWriter
        writer = JournalWriter.open(sys.argv[1], max_bytes=int(sys.argv[3]), max_files=8, resource={}, versions={})
        os.chmod(sys.argv[1], 0o500)
        if os.geteuid() == 0:  # root writes anywhere: become nobody, keeping the open file
            os.setgid(65534)
            os.setuid(65534)
        for i in range(int(sys.argv[2])):
            writer.write_sample(i, {"i": i, "pad": "x" * 200})
        writer.close()
        """,
        str(tmp_path / "j"),
        str(attempts),
        str(max_bytes),
    )
    _, stderr = child.communicate(timeout=60)

    assert child.returncode == 0, stderr
    assert stderr.count("vlmtrace: the journal") == 1 and "counted as dropped" in stderr
    (path,) = journal_files(tmp_path / "j")
    assert os.path.getsize(path) < max_bytes + 1024
    records, rest = read_journal_file(path)
    assert rest == ""
    written = len(of_kind(records, "sample"))
    assert [r["k"] for r in records[-2:]] == ["dropped", "end_marker"]
    assert records[-2]["journal_records"] == attempts - written


def test_a_journal_whose_directory_is_deleted_counts_what_it_drops_and_goes_on_where_it_can(tmp_path, caplog):
    directory = tmp_path / "j"
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        writer = open_writer(directory, sync=True)
        fill(writer, 10)
        for path in journal_files(directory):
            os.unlink(path)
        os.rmdir(directory)
        writer.maintain()  # the sampler's upkeep notices
        fill(writer, 25)  # dropped, counted
        writer.maintain()
        directory.mkdir()  # an operator puts the directory back
        time.sleep(1.1)
        writer.maintain()  # a new file, once a second
        fill(writer, 5)
        writer.close()

    messages = [r.getMessage() for r in caplog.records if r.name.startswith("vlmtrace.export.journal")]
    assert len(messages) == 2
    assert "its file was deleted" in messages[0] and "counted as dropped" in messages[0]
    assert "goes on in" in messages[1]
    (path,) = journal_files(directory)
    records, rest = read_journal_file(path)
    assert rest == ""
    assert len(of_kind(records, "sample")) == 5
    assert of_kind(records, "dropped")[-1]["journal_records"] == 25
    assert records[-1]["k"] == "end_marker"


def test_forked_children_that_return_at_once_journal_all_their_spans(tmp_path):
    """multiprocessing's fork start method ends its child with os._exit once the target returns (no atexit);
    a bare os.fork child ends with sys.exit. Both journal their 300 spans and end their journal."""
    child = start_python(
        "-c",
        """if True:
        import multiprocessing, os, sys
        from opentelemetry.trace import SpanKind
        from vlmtrace.config import Options
        from vlmtrace.export.recorder import SpanRecorder
        from vlmtrace.export.tracing import open_tracing
        tracing = open_tracing(Options.resolve({"journal": sys.argv[1]}))
        recorder = SpanRecorder(tracing.journal, tracing.tracer)  # vlmtrace's own spans, as its wrappers make them

        def work():
            for i in range(300):
                recorder.end(recorder.start("in the child", None, SpanKind.INTERNAL, {}))

        process = multiprocessing.get_context("fork").Process(target=work)
        process.start()
        process.join()
        pid = os.fork()
        if pid == 0:
            work()
            sys.exit(0)
        os.waitpid(pid, 0)
        """,
        str(tmp_path / "j"),
    )
    _, stderr = child.communicate(timeout=120)

    assert child.returncode == 0, stderr
    by_pid = {}
    for path in journal_files(tmp_path / "j"):
        records, rest = read_journal_file(path)
        assert rest == ""
        by_pid[records[0]["pid"]] = records
    children = [records for records in by_pid.values() if records[0]["ppid"] == child.pid]
    assert len(children) == 2
    for records in children:
        assert [r["name"] for r in of_kind(records, "end")] == ["in the child"] * 300
        marker = records[-1]
        assert marker["k"] == "end_marker" and marker["spans_started"] == marker["spans_ended"] == 300
