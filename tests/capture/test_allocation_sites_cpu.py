"""Allocation sites end to end on LMDeploy 0.18's real pipeline (stand-in TurboMind on the CPU): a host leak
kept by the vision encoder's preprocessing is suspected by the live rule, captured by tracemalloc for one
window, and named by its file and line as the first site of the host verdict, joined to its stage; a run
without a leak opens no window. Outside the window tracemalloc is off."""

from __future__ import annotations

import os
import tracemalloc

import orjson
import pytest

from tests.capture.conftest import standin_engines  # noqa: F401 - fixture
from tests.capture.recording import (
    LEAK_FILE,
    LEAK_LINE,
    HeapWindowClosed,
    MiB,
    keep_host_memory_in_vision_preprocess,
    run_pipeline,
)
from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.wording import headline
from vlmtrace.capture import suspicion

pytestmark = pytest.mark.lmdeploy


def _records(journal, kind: str) -> list[dict]:
    found = []
    for name in sorted(os.listdir(journal)):
        with open(journal / name, "rb") as lines:
            found += [orjson.loads(line) for line in lines if line.startswith(b'{"k":"%s"' % kind.encode())]
    return found


def test_a_host_leak_in_vision_preprocessing_is_named_by_its_file_and_line(standin_engines, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(suspicion, "FIT_EVERY_S", 0.1)  # the stand-in ends a request every few milliseconds
    kept: list = []
    keep_host_memory_in_vision_preprocess(monkeypatch, kept, MiB)
    # requests go on until the window has opened and closed: on a loaded machine the sampler reads fewer settled
    # levels per request, and the rule needs its points before it suspects the leak
    run_pipeline(tmp_path / "journal", requests=960, capture_window_requests=32, until=HeapWindowClosed())
    assert not tracemalloc.is_tracing()
    (capture,) = _records(tmp_path / "journal", "capture")
    assert capture["components"] == ["host"] and capture["reason"] == "auto" and capture["stopped_by"] == "requests"
    summary = analyze(read_inputs([str(tmp_path / "journal")])).summary
    (host,) = [verdict for verdict in summary.verdicts if verdict.component == "host"]
    assert host.klass == "host_growth" and host.stage == sc.STAGE_VISION_PREPROCESS, host
    first = host.allocation_sites[0]
    assert (first["file"], first["line"], first["stage"]) == (LEAK_FILE, LEAK_LINE, sc.STAGE_VISION_PREPROCESS), first
    assert first["function"].endswith("preprocess")
    # the window counts requests ended, and the leak is made where a request starts: up to the 4 requests in
    # flight more or fewer than the 32 counted
    assert MiB * 28 / 32 <= first["bytes_per_request"] <= MiB * 36 / 32, first
    assert 0.8 <= host.allocation_sites_explained <= 1.25, host.allocation_sites_explained
    assert f"allocated at recording.py:{LEAK_LINE} in `preprocess`" in headline(summary)[0]


def test_a_run_without_a_leak_opens_no_window(standin_engines, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(suspicion, "FIT_EVERY_S", 0.1)
    run_pipeline(tmp_path / "journal", requests=192, capture_window_requests=32)
    assert _records(tmp_path / "journal", "capture") == []
    assert not tracemalloc.is_tracing()
    summary = analyze(read_inputs([str(tmp_path / "journal")])).summary
    assert all(not verdict.allocation_sites for verdict in summary.verdicts)
