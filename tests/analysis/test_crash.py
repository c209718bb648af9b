"""A journal cut short by a crash: what was in flight, in which chain, under what memory."""

from __future__ import annotations

import orjson
from conftest import analyse
from synthetic import Scenario

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
        sc.STAGE_PIPELINE, sc.STAGE_REQUEST, sc.STAGE_VISION_INFER, sc.STAGE_VISION_FORWARD,
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
        "k": "start", "t": header["t"] + 10**9, "trace_id": "f" * 32, "span_id": "e" * 16, "parent_id": None,
        "name": sc.SPAN_PYTORCH_FORWARD, "kind": "INTERNAL", "thread": "engine",
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
