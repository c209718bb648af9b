"""The report and its summary are written whole or not at all (report/output.py)."""

from __future__ import annotations

import os
import signal
import stat
import time

import pytest

from vlmtrace.report import output


def test_the_file_replaces_the_old_one_with_a_plain_files_mode(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("old")
    output.replace_file(target, "<html>new</html>")
    assert target.read_text() == "<html>new</html>"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~output._umask()
    assert [path.name for path in tmp_path.iterdir()] == ["report.html"]


def test_an_interrupted_write_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_bytes(b'{"old": true}')

    def interrupted(source, destination):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        output.replace_file(target, b'{"new": true}')
    assert target.read_bytes() == b'{"old": true}'
    assert [path.name for path in tmp_path.iterdir()] == ["summary.json"]


def test_sigterm_while_the_report_is_written_removes_the_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "report.html"

    def terminated(source, destination):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises SystemExit here, before the rename

    monkeypatch.setattr(os, "replace", terminated)
    # the command's process: SIGTERM at its default (an instrumented test before may have left its own)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(SystemExit) as stopped:
            output.replace_file(target, "<html>half</html>")
        assert stopped.value.code == 128 + signal.SIGTERM
        assert list(tmp_path.iterdir()) == []
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back once the file is written
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_character_device_is_written_in_place(tmp_path):
    output.replace_file("/dev/null", "<html></html>")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
