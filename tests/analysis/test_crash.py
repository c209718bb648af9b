"""A journal cut short by a crash: what was in flight, in which chain, under what memory."""

from __future__ import annotations

import orjson
from synthetic import Scenario

from conftest import analyse
from vlmtrace import semconv as sc


def test_crash_report_names_the_chain_the_samples_and_the_stacks(journal):
    path, truth = journal(Scenario(requests=40, batch=4, crash_at_request=30))
    analysis = analyse(path)
    summary = analysis.summary
    assert summary.crashed
    assert sorted(span["name"] for span in summary.in_flight) == sorted(truth.in_flight)
    (crashed,) = summary.crash
    longest = max(crashed["chains"], key=len)
    assert [step["stage"] for step in longest] == [
        sc.STAGE_PIPELINE,
        sc.STAGE_REQUEST,
        sc.STAGE_VISION_INFER,
        sc.STAGE_VISION_FORWARD,
    ]
    assert 1 <= len(crashed["last_samples"]) <= 5
    assert all(sample["t_unix_nano"] <= crashed["last_record_unix_nano"] for sample in crashed["last_samples"])
    (fatal,) = crashed["fatal"]
    assert fatal["title"] == "Fatal Python error: Aborted"
    assert [thread["current"] for thread in fatal["threads"]] == [False, True]
    assert fatal["threads"][1]["frames"][0].startswith('File "/usr/lib/python3.11/site-packages/lmdeploy/turbomind')
    forward = next(span for span in summary.in_flight if span["stage"] == sc.STAGE_VISION_FORWARD)
    assert forward["attributes"][sc.VISION_PIXELS] > 0  # the sizes it was working on


def test_engine_step_links_name_the_requests_it_served(journal):
    path, _ = journal(Scenario(requests=10, crash_at_request=8))
    lines = path.read_bytes().splitlines(keepends=True)
    header = orjson.loads(lines[0])
    chat = next(orjson.loads(line) for line in lines if b'.stage":"request"' in line and b'"k":"start"' in line)
    step = {
        "k": "start",
        "t": header["t"] + 10**9,
        "trace_id": "f" * 32,
        "span_id": "e" * 16,
        "parent_id": None,
        "name": sc.SPAN_PYTORCH_FORWARD,
        "kind": "INTERNAL",
        "thread": "engine",
        "attrs": {sc.STAGE: sc.STAGE_ENGINE_FORWARD, sc.STEP_SEQUENCES: 1},
        "links": [{"trace_id": chat["trace_id"], "span_id": chat["span_id"]}],
    }
    path.write_bytes(lines[0] + orjson.dumps(step) + b"\n" + b"".join(lines[1:]))
    (crashed,) = analyse(path).summary.crash
    assert crashed["linked_requests"]["e" * 16] == [chat["name"]]


def test_clean_run_has_no_crash_section(journal):
    path, _ = journal(Scenario(requests=12))
    summary = analyse(path).summary
    assert not summary.crashed and summary.crash is None and summary.in_flight == []


def test_each_process_says_how_it_ended_crashed_killed_or_still_running(journal, tmp_path):
    """One journal per way a process can stop without an end record: faulthandler's report (crashed), none
    (killed), none with the file still locked by its writer (still running, not crashed)."""
    import fcntl
    import os

    from vlmtrace.analysis.wording import headline

    crashed_path, _ = journal(Scenario(requests=10, crash_at_request=8), name="crashed.jsonl")
    killed_path, _ = journal(Scenario(requests=10, crash_at_request=8), name="killed.jsonl")
    killed_path.write_bytes(killed_path.read_bytes().split(b"Fatal Python error")[0].rstrip(b"\0"))
    summary = analyse(crashed_path).summary
    (entry,) = summary.crash
    assert entry["ended"].startswith("crashed: SIGABRT in thread 0x")
    assert headline(summary)[0].startswith("The process crashed: SIGABRT in thread 0x")

    summary = analyse(killed_path).summary
    assert summary.crashed and summary.crash[0]["ended"].startswith("killed: no end record, last record at 20")
    assert summary.processes[0]["ended"] == summary.crash[0]["ended"]

    fd = os.open(killed_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a live writer holds
        summary = analyse(killed_path).summary
    finally:
        os.close(fd)
    assert not summary.crashed and summary.crash[0]["ended"].startswith("still running (its journal is open")
    assert "crashed, or still running" not in " ".join(headline(summary))


def test_an_end_record_naming_sigterm_is_a_clean_stop_by_sigterm(journal):
    path, _ = journal(Scenario(requests=12))
    lines = path.read_bytes().splitlines(keepends=True)
    marker = orjson.loads(lines[-1])
    assert marker["k"] == "end_marker"
    path.write_bytes(b"".join(lines[:-1]) + orjson.dumps({**marker, "ended_by": "SIGTERM"}) + b"\n")
    summary = analyse(path).summary
    assert not summary.crashed and summary.crash is None
    assert [process["ended"] for process in summary.processes] == ["stopped by SIGTERM (clean end)"]


def test_an_empty_journal_file_beside_others_is_a_note_not_bad_input(journal, tmp_path):
    """A process killed between creating its journal file and writing the header leaves 0 bytes."""
    from vlmtrace.analysis.readers.detect import read_inputs

    path, _ = journal(Scenario(requests=12), name="vlmtrace-host-1-1.0.jsonl")
    (path.parent / "vlmtrace-host-2-1.0.jsonl").write_bytes(b"")
    data = read_inputs([str(path.parent)])
    assert [problem.severity for problem in data.problems] == ["note"]
    assert len(data.processes) == 1
