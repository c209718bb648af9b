"""Windows in a real instrumented process: `vlmtrace capture --pid` opens one by hand, found through the
journal the process has open (a process that does not take the request, and one that does not exist, exit
with their documented codes); `capture="now"` opens one at `instrument()`; each is recorded at
`uninstrument()` with what it kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

SOURCE = str(Path(__file__).resolve().parents[2] / "src")
# An instrumented process that keeps host memory until its stdin closes, then uninstruments.
CHILD = """
import sys, vlmtrace
vlmtrace.instrument(journal=sys.argv[1], sample_interval_ms=50, capture=sys.argv[2])
print("ready", flush=True)
kept = []
for line in sys.stdin:
    kept.append(bytearray(4 << 20))  # kept by hand
vlmtrace.uninstrument()
"""


def _child(journal: Path, mode: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(journal), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": SOURCE},
    )
    assert child.stdout.readline().strip() == "ready"
    return child


def _capture(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vlmtrace", "capture", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": SOURCE},
    )


def test_a_window_opened_by_hand_records_what_the_process_kept(tmp_path):
    child = _child(tmp_path / "journal", "auto")
    try:
        done = _capture("--pid", str(child.pid))
        assert done.returncode == 0, done.stderr
        assert str(tmp_path / "journal") in done.stdout
        child.communicate("keep\n" * 3, timeout=60)
    finally:
        child.kill()
    lines = b"".join(path.read_bytes() for path in (tmp_path / "journal").glob("*.jsonl")).splitlines()
    (record,) = [orjson.loads(line) for line in lines if line.startswith(b'{"k":"capture"')]
    assert (record["reason"], record["stopped_by"], record["components"]) == ("by hand", "shutdown", ["host"])
    first = record["sites"][0]
    assert first["file"] == "<string>" and first["bytes"] >= 3 * (4 << 20)


def test_a_process_with_capture_off_does_not_take_the_request(tmp_path):
    child = _child(tmp_path / "journal", "off")
    try:
        done = _capture("--pid", str(child.pid), "--wait", "1")
        assert done.returncode == 1, done.stderr
        assert "did not take the request within 1 s" in done.stderr
        assert not any(path.name.startswith("vlmtrace-capture.") for path in (tmp_path / "journal").iterdir())
    finally:
        child.kill()
        child.wait()


def test_no_such_process_or_no_journal_is_bad_input(tmp_path):
    done = _capture("--pid", "999999999")
    assert done.returncode == 2 and "no process 999999999" in done.stderr
    done = _capture("--pid", str(os.getpid()), "--journal", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no journal directory at" in done.stderr


def test_capture_now_opens_a_window_at_once_and_records_it_at_uninstrument(tmp_path):
    child = _child(tmp_path / "journal", "now")
    child.communicate("keep\n" * 2, timeout=60)
    lines = b"".join(path.read_bytes() for path in (tmp_path / "journal").glob("*.jsonl")).splitlines()
    (record,) = [orjson.loads(line) for line in lines if line.startswith(b'{"k":"capture"')]
    assert (record["reason"], record["stopped_by"], record["tool"]) == ("now", "shutdown", "tracemalloc")
    assert record["sites"][0]["bytes"] >= 2 * (4 << 20)
