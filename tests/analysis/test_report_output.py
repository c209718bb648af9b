"""The report and its summary are written whole or not at all (report/output.py)."""

from __future__ import annotations

import os
import stat

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
