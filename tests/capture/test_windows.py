"""Capture windows, driven as the sampler drives them: no hook outside a window (tracemalloc stopped, torch
recording no history), a window bounded by requests, seconds and bytes, at most one `auto` window per
component per period, one opened by hand through the trigger file, and the application's own tracemalloc
left running and untouched."""

from __future__ import annotations

import os
import tracemalloc

import orjson
import pytest

from vlmtrace import semconv as sc
from vlmtrace.capture.controller import (
    AUTO,
    BY_HAND,
    NOW,
    Bounds,
    CaptureController,
    trigger_path,
)
from vlmtrace.capture.suspicion import Suspicion
from vlmtrace.capture.torch_window import TorchWindow
from vlmtrace.export.journal.writer import JournalWriter
from vlmtrace.instrumentation.targets import FAMILY_0_16

MiB = 1 << 20
BOUNDS = Bounds(requests=4, seconds=600, bytes=256 * MiB, every_s=3600)


@pytest.fixture
def journal(tmp_path):
    writer = JournalWriter.open(
        str(tmp_path / "journal"), max_bytes=1 << 24, max_files=2, resource={}, versions={}, sync=True
    )
    yield writer
    writer.close()


def _records(writer: JournalWriter, kind: str) -> list[dict]:
    folder = os.path.dirname(writer.path)
    found = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".jsonl"):
            with open(os.path.join(folder, name), "rb") as lines:
                found += [orjson.loads(line) for line in lines if line.startswith(b'{"k":"%s"' % kind.encode())]
    return found


def _request_ends(controller: CaptureController, count: int) -> None:
    watch = controller.watch(None)
    for _ in range(count):
        watch(sc.STAGE_VISION_PREPROCESS, {})
        watch(sc.STAGE_REQUEST, {})


def _kept_in_the_window(kept: list) -> None:
    kept.append(bytearray(3 * MiB))  # the window's site


def test_no_hook_before_or_after_a_window_and_the_sites_of_what_it_kept(journal):
    controller = CaptureController(NOW, BOUNDS, journal, FAMILY_0_16.targets)
    assert not tracemalloc.is_tracing()
    controller.on_sample(1, {})
    assert tracemalloc.is_tracing()
    kept: list = []
    _kept_in_the_window(kept)
    _request_ends(controller, 3)
    controller.on_sample(2, {})
    assert tracemalloc.is_tracing()  # 3 of 4 requests
    _request_ends(controller, 1)
    controller.on_sample(3, {})
    assert not tracemalloc.is_tracing()
    (record,) = _records(journal, "capture")
    assert (record["components"], record["reason"], record["stopped_by"], record["requests"]) == (
        ["host"],
        NOW,
        "requests",
        4,
    )
    first = record["sites"][0]
    assert (first["file"], first["function"]) == (__file__, "_kept_in_the_window")
    assert first["bytes"] >= 3 * MiB and first["bytes_per_request"] == first["bytes"] / 4
    controller.on_sample(4, {})
    assert not tracemalloc.is_tracing()  # `now` opens once


def test_torch_history_is_never_turned_on_where_torch_has_not_initialised_cuda(journal):
    assert TorchWindow.available() is not None
    controller = CaptureController(NOW, BOUNDS, journal, FAMILY_0_16.targets)
    controller.on_sample(1, {})
    _request_ends(controller, 4)
    controller.on_sample(2, {})
    assert [record["tool"] for record in _records(journal, "capture")] == ["tracemalloc"]


def test_a_window_stops_at_its_bytes_and_auto_opens_one_per_component_per_period(journal):
    controller = CaptureController(
        AUTO,
        Bounds(requests=1000, seconds=600, bytes=MiB, every_s=3600),
        journal,
        FAMILY_0_16.targets,
        Suspicion(fit_every_s=0),
    )
    level, kept = 2e9, []
    for request in range(60):
        _request_ends(controller, 1)
        level += 2 * MiB
        controller.on_sample(request, {sc.MEM_HOST_RSS: level})
        if tracemalloc.is_tracing():
            kept.append(bytearray(2 * MiB))
    assert not tracemalloc.is_tracing()
    (record,) = _records(journal, "capture")
    assert record["reason"] == AUTO and record["stopped_by"] == "bytes" and record["rate_at_start"] == 2 * MiB


def test_a_window_opened_by_hand_through_the_trigger_file(journal):
    controller = CaptureController(AUTO, BOUNDS, journal, FAMILY_0_16.targets)
    trigger = trigger_path(os.path.dirname(journal.path), os.getpid())
    open(trigger, "w").close()
    controller.on_sample(1, {})
    assert tracemalloc.is_tracing() and not os.path.exists(trigger)
    controller.close()
    assert not tracemalloc.is_tracing()
    (record,) = _records(journal, "capture")
    assert (record["reason"], record["stopped_by"]) == (BY_HAND, "shutdown")


def test_the_applications_own_tracemalloc_is_left_running(journal):
    tracemalloc.start(1)
    try:
        controller = CaptureController(NOW, BOUNDS, journal, FAMILY_0_16.targets)
        controller.on_sample(1, {})
        _request_ends(controller, 4)
        controller.on_sample(2, {})
        assert tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() == 1
    finally:
        tracemalloc.stop()
    assert _records(journal, "capture") == []
    assert any("tracemalloc is already running" in record["message"] for record in _records(journal, "warning"))


def test_a_failing_window_is_one_warning_and_tracemalloc_is_stopped(journal, monkeypatch):
    controller = CaptureController(NOW, BOUNDS, journal, FAMILY_0_16.targets)
    controller.on_sample(1, {})

    def broken(*args, **kwargs):
        raise RuntimeError("no snapshot")

    monkeypatch.setattr(tracemalloc, "take_snapshot", broken)
    _request_ends(controller, 4)
    controller.on_sample(2, {})  # never raises into the sampler
    assert not tracemalloc.is_tracing()
    assert any(
        "capture failed (RuntimeError: no snapshot)" in record["message"] for record in _records(journal, "warning")
    )
