"""The cache guard (trim_cache): when it trims, what each trim records, and that it never breaks the service.

A CPU machine has no CUDA, so torch's allocator counters and NVML come from tests/support/fake_gpu.py,
and the one call that acts on the allocator (`release_torch_cache`, torch.cuda.empty_cache() in a
device's context) is replaced by `Allocator.release`, which does to those counters what the real call
does to torch's (every device's free segments go back to CUDA). Everything from the readings to the
exported span and the journal is vlmtrace's real code: the probe, the sampler, the guard, the recorder,
the SDK's in-memory exporter.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import StatusCode

import vlmtrace
from tests.support import fake_gpu
from tests.support.fake_gpu import GIB
from tests.support.spans import finished, image
from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.step2_preparing.tables import build_tables
from vlmtrace.analysis.step4_outlook.empty_cache import cache_trim_cost
from vlmtrace.config import CacheBound
from vlmtrace.instrumentation import cache_guard
from vlmtrace.probes.memory import MemoryProbe

MiB = 1 << 20
SECOND = 1_000_000_000


class Allocator:
    """The stand-in for torch's caching allocator on fake_gpu's two GPUs."""

    def __init__(self, monkeypatch) -> None:
        self._monkeypatch = monkeypatch
        self.released: list[int] = []
        self.threads: list[str] = []  # where each release ran

    def hold(self, ordinal: int, allocated: int, reserved: int) -> None:
        """Torch holds `reserved` bytes on the device, `allocated` of them in tensors (NVML follows)."""
        grown = reserved - fake_gpu.TORCH[ordinal].reserved
        self._set(ordinal, fake_gpu.TORCH[ordinal]._replace(allocated=allocated, reserved=reserved), grown)

    def _set(self, ordinal: int, reading, grown: int) -> None:
        def replaced(values, value):
            return tuple(value if i == ordinal else v for i, v in enumerate(values))

        self._monkeypatch.setattr(fake_gpu, "TORCH", replaced(fake_gpu.TORCH, reading))
        self._monkeypatch.setattr(fake_gpu, "USED", replaced(fake_gpu.USED, fake_gpu.USED[ordinal] + grown))
        self._monkeypatch.setattr(fake_gpu, "PROCESS", replaced(fake_gpu.PROCESS, fake_gpu.PROCESS[ordinal] + grown))

    def release(self, ordinal: int) -> None:
        torch.cuda.empty_cache()  # the real, instrumented function (a no-op without CUDA): no span inside a trim
        self.released.append(ordinal)
        self.threads.append(threading.current_thread().name)
        for device, reading in enumerate(fake_gpu.TORCH):
            self._set(device, reading._replace(reserved=reading.allocated), reading.allocated - reading.reserved)


@pytest.fixture
def allocator(monkeypatch):
    with fake_gpu.two_gpus():
        found = Allocator(monkeypatch)
        monkeypatch.setattr(cache_guard, "release_torch_cache", found.release)
        yield found


@pytest.fixture
def guarded(allocator, exporter, tmp_path):
    """vlmtrace with trim_cache=1.5GiB, spans into memory and a journal; the sampler's thread stays
    idle (the tests take samples themselves), its first sample is taken by instrument()."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    session = vlmtrace.instrument(
        tracer_provider=provider,
        journal=str(tmp_path / "journal"),
        sample_interval_ms=600_000,
        trim_cache="1.5GiB",
        trim_cache_interval_ms=5000,
    )
    yield session
    vlmtrace.uninstrument()


def _trims(exporter):
    return [span for span in finished(exporter) if span.name == sc.SPAN_CACHE_TRIM]


def test_a_crossed_bound_is_trimmed_from_the_sampler_at_most_once_per_interval(guarded, allocator, exporter, tmp_path):
    # fake_gpu: torch caches 2 GiB on device 0 (7 reserved, 5 allocated) and 1 GiB on device 1: over 1.5 GiB.
    assert allocator.released == [0]  # at instrument()'s first sample, in device 0's context
    (trim,) = _trims(exporter)
    assert trim.parent is None and trim.attributes[sc.STAGE] == sc.STAGE_CACHE_TRIM
    assert trim.attributes[sc.CACHE_TRIM_BOUND] == "cached"
    assert trim.attributes[sc.CACHE_TRIM_LIMIT] == 1536 * MiB
    assert (trim.attributes[sc.CACHE_TRIM_DEVICE], trim.attributes[sc.CACHE_TRIM_CACHED]) == (0, 2 * GIB)
    assert trim.attributes[sc.CACHE_TRIM_FREE] == 50 * GIB  # 80 total - 30 used
    assert trim.attributes[sc.CACHE_TRIM_RELEASED] == 3 * GIB  # both devices' free segments
    assert trim.attributes[sc.MEM_TORCH_RESERVED + sc.DELTA_SUFFIX] == -3 * GIB
    assert trim.attributes[sc.MEM_TORCH_ALLOCATED + sc.DELTA_SUFFIX] == 0
    # NVML was read again after the trim: the process's memory outside torch did not move.
    assert trim.attributes[sc.MEM_NATIVE + sc.DELTA_SUFFIX] == 0
    assert trim.attributes[sc.MEM_GPU_PROCESS + sc.DELTA_SUFFIX] == -3 * GIB
    assert not [span for span in finished(exporter) if span.name == sc.SPAN_EMPTY_CACHE]
    first = trim.attributes[sc.CACHE_TRIM_TRIGGER_TIME]

    allocator.hold(1, 3 * GIB, 6 * GIB)  # device 1 caches 3 GiB now
    guard = guarded.cache_guard
    guard.on_sample(first + 4 * SECOND, guarded.probe.sample().attributes)
    assert allocator.released == [0]  # within the interval: no trim
    guard.on_sample(first + 6 * SECOND, guarded.probe.sample().attributes)
    assert allocator.released == [0, 1]
    second = _trims(exporter)[-1]
    assert (second.attributes[sc.CACHE_TRIM_DEVICE], second.attributes[sc.CACHE_TRIM_CACHED]) == (1, 3 * GIB)
    assert (guard.trims, guard.released_bytes) == (2, 6 * GIB)
    guard.on_sample(first + 20 * SECOND, guarded.probe.sample().attributes)
    assert guard.trims == 2  # under the bound: nothing to do

    vlmtrace.uninstrument()
    cost = cache_trim_cost(build_tables(read_inputs([str(tmp_path / "journal")])))
    assert cost.calls == 2 and cost.released_bytes == 6 * GIB  # the analyzer reads the journal's trims


def test_the_sampler_thread_runs_the_guard(allocator, exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    vlmtrace.instrument(
        tracer_provider=provider, journal=None, sample_interval_ms=5, trim_cache="1.5GiB", trim_cache_interval_ms=0
    )
    try:
        allocator.hold(0, 5 * GIB, 8 * GIB)  # the cache grows again after the first sample's trim
        deadline = time.monotonic() + 10
        while len(allocator.released) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)  # polling for the sampler thread's work, with a deadline: not a synchronisation
    finally:
        vlmtrace.uninstrument()
    assert allocator.threads == ["MainThread", "vlmtrace-sampler"]  # instrument()'s first sample, then the thread's
    assert len(_trims(exporter)) == 2


def test_a_vision_stage_that_ends_over_the_bound_wakes_the_sampler_which_trims(
    allocator, exporter, cpu_pipeline, monkeypatch
):
    """A torch vision tower beside TurboMind, on the real pipeline: a torch tower's temporaries, freed into the cache as the
    vision stage ends, leave it over the bound; the sampler (next tick in ten minutes) trims at once,
    on its own thread, after the stage has ended."""
    from lmdeploy import GenerationConfig
    from lmdeploy.vl.engine import ImageEncoder

    original = ImageEncoder.__dict__["preprocess"]

    async def preprocess_with_tower(encoder, messages, *args, **kwargs):
        allocator.hold(0, 5 * GIB, 8 * GIB)  # the tower ran: 3 GiB cached on device 0
        return await original(encoder, messages, *args, **kwargs)

    monkeypatch.setattr(ImageEncoder, "preprocess", preprocess_with_tower)  # before instrument(): inside its span
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # fake_gpu caches 2 and 1 GiB: under 2.5 GiB, so instrument()'s first sample trims nothing.
    session = vlmtrace.instrument(
        tracer_provider=provider,
        journal=None,
        sample_interval_ms=600_000,
        trim_cache="2.5GiB",
        trim_cache_interval_ms=0,
    )
    try:
        assert allocator.released == []
        cpu_pipeline([("describe this image", image(64, 64))], gen_config=GenerationConfig(max_new_tokens=2))
        deadline = time.monotonic() + 10
        while not allocator.released and time.monotonic() < deadline:
            time.sleep(0.005)  # polling for the sampler thread's work, with a deadline: not a synchronisation
        guard = session.cache_guard
    finally:
        vlmtrace.uninstrument()
    assert allocator.threads == ["vlmtrace-sampler"] and allocator.released == [0]
    assert guard.wakes >= 1 and guard.trims == 1
    spans = finished(exporter)
    (trim,) = [span for span in spans if span.name == sc.SPAN_CACHE_TRIM]
    (preprocess,) = [span for span in spans if span.attributes.get(sc.STAGE) == sc.STAGE_VISION_PREPROCESS]
    assert trim.attributes[sc.CACHE_TRIM_CACHED] == 3 * GIB
    assert trim.start_time >= preprocess.end_time  # between the vision stage and what follows, not inside it


def test_a_vision_stage_end_within_the_interval_after_a_trim_wakes_nothing(guarded, allocator):
    wakes = []
    guarded.cache_guard.watch_stage_ends(lambda: wakes.append(1))
    allocator.hold(1, 3 * GIB, 6 * GIB)  # device 1 caches 3 GiB: over 1.5 GiB
    guarded.cache_guard.on_span_end(sc.STAGE_VISION_PREPROCESS, guarded.probe.sample().attributes)
    assert wakes == []  # instrument()'s first sample trimmed less than trim_cache_interval_ms (5 s) ago


def test_only_vision_stage_ends_over_the_bound_wake_the_sampler(allocator):
    session = vlmtrace.instrument(
        tracer_provider=TracerProvider(),
        journal=None,
        sample_interval_ms=600_000,
        trim_cache="1.5GiB",
        trim_cache_interval_ms=0,
    )
    try:
        guard = session.cache_guard
        wakes = []
        guard.watch_stage_ends(lambda: wakes.append(1))
        allocator.hold(1, 3 * GIB, 6 * GIB)  # device 1 caches 3 GiB: over 1.5 GiB
        reading = session.probe.sample().attributes
        for stage in (sc.STAGE_REQUEST, sc.STAGE_ENGINE_STREAM, sc.STAGE_CACHE_TRIM, None):
            guard.on_span_end(stage, reading)
        assert wakes == []  # vision stages free a tower's temporaries into torch's cache: the others are not watched
        for stage in (sc.STAGE_VISION_PREPROCESS, sc.STAGE_VISION_FORWARD):
            guard.on_span_end(stage, reading)
        assert len(wakes) == guard.wakes == 2
        allocator.hold(1, 3 * GIB, 3 * GIB)
        guard.on_span_end(sc.STAGE_VISION_FORWARD, session.probe.sample().attributes)
        assert len(wakes) == 2  # under the bound
        assert allocator.released == [0]  # instrument()'s first sample's; the request path only wakes
    finally:
        vlmtrace.uninstrument()


def test_under_a_headroom_bound_a_vision_stage_end_estimates_free_memory_from_torchs_growth(allocator):
    session = vlmtrace.instrument(
        tracer_provider=TracerProvider(),
        journal=None,
        sample_interval_ms=600_000,
        trim_cache="headroom=45GiB",
        trim_cache_interval_ms=0,
        probe_reuse_us=0,
    )
    try:
        guard = session.cache_guard
        wakes = []
        guard.watch_stage_ends(lambda: wakes.append(1))
        # fake_gpu at instrument()'s sample: 50 and 68 GiB free, torch reserving 7 and 4 GiB. A span
        # end's quick reading has torch's live counters and that sample's NVML numbers: device 1 runs
        # short of 45 GiB free once torch reserves more than 68 - 45 + 4 = 27 GiB there.
        allocator.hold(1, 4 * GIB, 26 * GIB)
        guard.on_span_end(sc.STAGE_VISION_PREPROCESS, session.probe.read().attributes)
        assert wakes == []  # 46 GiB free
        allocator.hold(1, 4 * GIB, 29 * GIB)
        guard.on_span_end(sc.STAGE_VISION_PREPROCESS, session.probe.read().attributes)
        assert len(wakes) == guard.wakes == 1  # 43 GiB free, 25 GiB of it cached: the sampler decides
        allocator.hold(1, 29 * GIB - 16 * MiB, 29 * GIB)
        guard.on_span_end(sc.STAGE_VISION_PREPROCESS, session.probe.read().attributes)
        assert len(wakes) == 1  # short of headroom, but 16 MiB cached is not worth a trim
        guard.on_sample(time.time_ns(), session.probe.sample().attributes)
        assert allocator.released == []  # the full reading agrees: nothing worth trimming
    finally:
        vlmtrace.uninstrument()


def _sample(probes=("torch", "nvml", "host")):
    probe = MemoryProbe(probes)
    try:
        return probe.sample().attributes
    finally:
        probe.close()


def test_headroom_trims_a_device_short_of_free_memory_only_when_torch_caches_enough_there(allocator):
    reading = _sample()  # free: 50 GiB on device 0, 68 GiB on device 1; cached: 2 GiB, 1 GiB
    assert cache_guard.find_crossing(reading, CacheBound("headroom", 40 * GIB)) is None
    assert cache_guard.find_crossing(reading, CacheBound("headroom", 60 * GIB)) == cache_guard.Crossing(
        0, 2 * GIB, 50 * GIB
    )
    allocator.hold(0, 5 * GIB, 5 * GIB + 16 * MiB)  # device 0 short of headroom, with too little cached to matter
    reading = _sample()
    assert cache_guard.find_crossing(reading, CacheBound("headroom", 60 * GIB)) is None
    assert cache_guard.find_crossing(reading, CacheBound("headroom", 70 * GIB)) == cache_guard.Crossing(
        1, 1 * GIB, 68 * GIB
    )
    assert cache_guard.find_crossing(reading, CacheBound("cached", 1 * GIB)) is None  # 1 GiB is not over 1 GiB


def test_nothing_is_trimmed_without_torch_readings(allocator):
    reading = _sample(("nvml", "host"))  # TurboMind alone: NVML sees memory, torch holds none
    assert sc.MEM_DEVICES in reading
    assert cache_guard.find_crossing(reading, CacheBound("headroom", 79 * GIB)) is None
    assert cache_guard.find_crossing(reading, CacheBound("cached", 1)) is None


def test_a_failing_release_ends_its_span_in_error_and_stops_the_guard(allocator, monkeypatch, exporter, caplog):
    def broken(ordinal):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(cache_guard, "release_torch_cache", broken)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        session = vlmtrace.instrument(
            tracer_provider=provider,
            journal=None,
            sample_interval_ms=600_000,
            trim_cache="1GiB",
            trim_cache_interval_ms=0,
        )
    try:
        (trim,) = _trims(exporter)
        assert trim.status.status_code is StatusCode.ERROR and "illegal memory access" in trim.status.description
        assert trim.attributes[sc.CACHE_TRIM_RELEASED] == 0
        session.cache_guard.on_sample(time.time_ns(), session.probe.sample().attributes)
        assert len(_trims(exporter)) == 1
        assert "the cache guard stops" in caplog.text
    finally:
        vlmtrace.uninstrument()


def test_a_sample_the_guard_cannot_read_stops_the_guard_not_the_sampler(guarded, allocator, caplog):
    broken = {**guarded.probe.sample().attributes, sc.MEM_TORCH_RESERVED + sc.PER_DEVICE_SUFFIX: (1,)}
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        guarded.cache_guard.on_sample(time.time_ns() + 60 * SECOND, broken)  # one device's value for two
    assert "the cache guard stops: reading the sample failed (IndexError" in caplog.text
    allocator.hold(0, 5 * GIB, 9 * GIB)
    guarded.sampler.sample_once()  # the sampler goes on; the guard no longer trims
    assert allocator.released == [0]


def test_the_gpu_benchmark_script_imports_and_checks_its_arguments(monkeypatch, capsys):
    """benchmarks/gpu_cache_guard.py runs on the lent H200 only (its --standin mode on a CPU proves the
    plumbing in ~30 s, too long for every CI run); here it must run as a script and check its arguments."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo / "benchmarks")])}
    script = str(repo / "benchmarks" / "gpu_cache_guard.py")
    shown = subprocess.run(
        [sys.executable, script, "--help"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "--trim-cache" in shown.stdout and "empty_cache" in shown.stdout
    assert "--blocks" in shown.stdout and "--per-block" in shown.stdout and "guard=SIZE" in shown.stdout

    monkeypatch.syspath_prepend(str(repo / "benchmarks"))
    benchmark = importlib.import_module("gpu_cache_guard")
    args = benchmark.parse_args(
        ["--out", "x", "--arms", "none,guard,guard=1GiB,guard=2GiB@250,empty_cache", "--trim-cache", "256MiB"]
    )
    assert [benchmark.arm_options(arm, args) for arm in ("none", "guard", "guard=1GiB", "guard=2GiB@250")] == [
        {"sample_interval_ms": 100},
        {"sample_interval_ms": 100, "trim_cache": "256MiB", "trim_cache_interval_ms": 0},
        {"sample_interval_ms": 100, "trim_cache": "1GiB", "trim_cache_interval_ms": 0},
        {"sample_interval_ms": 100, "trim_cache": "2GiB", "trim_cache_interval_ms": 250},
    ]
    orders = [benchmark.round_order(["a", "b", "c"], index, args) for index in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]  # every arm in every position

    def arm(trim_cache, peak_gib, ratio):
        return {
            "options": {"trim_cache": trim_cache} if trim_cache else {},
            "torch_reserved_bytes": {"peak": int(peak_gib * GIB)},
            "block_median_ratio_to_none": {"median": ratio} if ratio else None,
        }

    checks = benchmark.done_when(
        {
            "none": arm(None, 4, None),
            "empty_cache": arm(None, 2, 1.02),
            "guard=512MiB": arm("512MiB", 2.4, 1.004),
            "guard=1GiB": arm("1GiB", 3.1, 1.02),
            "guard=headroom=4GiB": arm("headroom=4GiB", 2, 1.0),
        }
    )
    assert checks == {
        "guard=512MiB": {
            "peak_over_empty_cache_bytes": int(0.4 * GIB),
            "bound_bytes": 512 * MiB,
            "peak_bounded": True,
            "median_ratio": 1.004,
            "median_at_most_1_percent_slower": True,
        },
        "guard=1GiB": {
            "peak_over_empty_cache_bytes": int(3.1 * GIB) - 2 * GIB,
            "bound_bytes": GIB,
            "peak_bounded": False,
            "median_ratio": 1.02,
            "median_at_most_1_percent_slower": False,
        },
    }
    for arms, why in (
        ("none,cure", "unknown arm(s) cure"),
        ("none,none=1GiB", "unknown arm(s) none=1GiB"),
        ("none,guard=1GiB@soon", "arm guard=1GiB@soon: "),
        ("none,guard=12XB", "arm guard=12XB: trim_cache='12XB' is not a size"),
        ("guard=1GiB,guard=1GiB", "an arm is named twice"),
    ):
        with pytest.raises(SystemExit) as refused:
            benchmark.parse_args(["--out", "x", "--arms", arms])
        assert refused.value.code == 2 and why in capsys.readouterr().err, arms


def _write_block(journals: Path, round_index: int, arm: str, latencies_s: list[float], trims_after: tuple = ()) -> None:
    """A block's journal as the benchmark leaves it: one `lmdeploy.pipeline.infer` span per request, and
    a `vlmtrace.cache.trim` span in the gap after each request of `trims_after` (by position)."""
    block = journals / f"b{round_index:02d}-{arm.replace('=', '-')}"
    block.mkdir(parents=True)
    start, lines = 10**18, []
    for position, seconds in enumerate(latencies_s):
        end = start + int(seconds * 1e9)
        lines.append(json.dumps({"k": "end", "t": end, "start": start, "name": "lmdeploy.pipeline.infer"}))
        if position in trims_after:
            lines.append(json.dumps({"k": "end", "t": end + 800, "start": end + 100, "name": "vlmtrace.cache.trim"}))
        start = end + 1000
    (block / "vlmtrace-host-1-1.0.jsonl").write_text("\n".join(lines) + "\n")


def test_the_stats_script_resamples_rounds_and_pairs_each_request_with_the_same_one_without_trimming(
    monkeypatch, tmp_path
):
    """benchmarks/cache_guard_stats.py: a guard that makes every request exactly 10 % slower, in rounds
    whose speed differs, is 1.1 by every estimate, with no spread: the rounds move both arms alike.
    Another whose trims make the request after each 50 % slower and leave the rest as fast as without
    it: the requests near trims are two of the block's seven, so the trims cost a seventh."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(repo / "benchmarks"))
    stats = importlib.import_module("cache_guard_stats")
    (tmp_path / "summary.json").write_text(json.dumps({"arguments": {"warmup": 1}}))
    for round_index, scale in enumerate((1.0, 1.3, 0.8, 1.1)):
        base = [scale * 0.015 * (1 + position % 3) for position in range(7)]
        _write_block(tmp_path / "journals", round_index, "none", [5.0, *base])  # the warm-up is dropped
        _write_block(tmp_path / "journals", round_index, "guard=1GiB", [5.0] + [1.1 * value for value in base])
        after_trims = [1.5 * value if position in (1, 4) else value for position, value in enumerate(base)]
        _write_block(tmp_path / "journals", round_index, "guard=2GiB", [5.0, *after_trims], trims_after=(1, 4))
    stats.main([str(tmp_path), "--resamples", "200", "--json", str(tmp_path / "stats.json")])
    result = json.loads((tmp_path / "stats.json").read_text())
    for name in ("block_median", "pooled_median", "paired_median", "mean"):
        assert result["guard-1GiB"][name]["ratio"] == pytest.approx(1.1, rel=1e-6)
        assert result["guard-1GiB"][name]["interval_95"] == pytest.approx([1.1, 1.1], rel=1e-6)
    assert result["guard-1GiB"]["rounds"] == 4 and result["guard-1GiB"]["rounds_slower"] == 4
    assert "near_trims" not in result["guard-1GiB"]
    near = result["guard-2GiB"]["near_trims"]  # positions 1 and 4 of the timed 0..6 follow a trim
    assert near["share_of_requests"] == pytest.approx(2 / 7)
    assert (near["near_median"], near["rest_median"]) == (pytest.approx(1.5), pytest.approx(1.0))
    assert near["cost_of_trims"] == pytest.approx(2 / 7 * 0.5)
    assert near["cost_of_trims_interval_95"] == pytest.approx([1 / 7, 1 / 7])


def test_the_h200_block_run_holds_what_the_docs_quote():
    """docs/cache-guard.md quotes this committed run (2026-12-03)."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-2026-12-03"
    summary = json.loads((results / "cache-guard-blocks-summary.json").read_text())
    arms, done = summary["arms"], summary["done_when"]
    assert summary["rounds"] == 20 and all(arm["requests"] == 2000 for arm in arms.values())
    assert done["guard=1GiB"]["peak_bounded"] and done["guard=1GiB"]["median_at_most_1_percent_slower"]
    assert done["guard=512MiB"]["peak_bounded"] and not done["guard=512MiB"]["median_at_most_1_percent_slower"]
    assert [round(done[arm]["median_ratio"], 4) for arm in ("guard=1GiB", "guard=512MiB")] == [1.0023, 1.0334]
    assert [
        arms[arm]["torch_reserved_bytes"]["peak"] // MiB
        for arm in ("none", "guard=512MiB", "guard=1GiB", "empty_cache")
    ] == [4020, 2078, 2510, 2032]
    assert [arms[arm]["trims"] for arm in ("guard=512MiB", "guard=1GiB")] == [839, 473]
    assert not any(arm["analysis"]["leak_found"] for arm in arms.values())
    stats = json.loads((results / "cache-guard-blocks-stats.json").read_text())
    assert [round(stats["guard-1GiB"][name]["ratio"], 3) for name in ("pooled_median", "paired_median", "mean")] == [
        1.036,
        1.037,
        1.037,
    ]


def test_the_h200_ablation_run_holds_what_the_docs_quote():
    """docs/cache-guard.md quotes this
    committed run: the guard with a bound it never reaches costs nothing measurable, its trims do."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-2026-12-03"
    summary = json.loads((results / "cache-guard-ablation-summary.json").read_text())
    arms = summary["arms"]
    assert summary["rounds"] == 45 and all(arm["requests"] == 4500 for arm in arms.values())
    assert [arms[arm]["trims"] for arm in ("none", "guard=64GiB", "guard=1GiB")] == [0, 0, 1023]
    assert [
        round(arms[arm]["torch_reserved_bytes"]["after_request"]["mean"] / MiB)
        for arm in ("none", "guard=64GiB", "guard=1GiB")
    ] == [2840, 2840, 610]
    stats = json.loads((results / "cache-guard-ablation-stats.json").read_text())
    quoted = {"guard-1GiB": (1.018, 1.013, 1.031), "guard-64GiB": (0.987, 0.981, 1.019)}
    for arm, (ratio, low, high) in quoted.items():
        block = stats[arm]["block_median"]
        assert (round(block["ratio"], 3), *(round(bound, 3) for bound in block["interval_95"])) == (ratio, low, high)
    assert (
        stats["guard-1GiB"]["paired_median"]["interval_95"][0]
        > 1
        > stats["guard-64GiB"]["paired_median"]["interval_95"][0]
    )


def test_the_stop_23_runs_hold_what_the_docs_quote():
    """docs/cache-guard.md quotes these committed runs."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-2026-12-03"
    bounds = json.loads((results / "cache-guard-bounds-summary.json").read_text())
    arms = bounds["arms"]
    assert bounds["rounds"] == 37 and all(arm["requests"] == 3700 for arm in arms.values())
    assert [arms[arm]["trims"] for arm in ("guard=1GiB", "guard=1GiB@250", "guard=2GiB")] == [838, 350, 108]
    assert [
        arms[arm]["torch_reserved_bytes"]["peak"] // MiB
        for arm in ("none", "guard=1GiB", "guard=1GiB@250", "guard=2GiB")
    ] == [4256, 2528, 4288, 3490]
    assert not any(arm["analysis"]["leak_found"] for arm in arms.values())
    stats = json.loads((results / "cache-guard-bounds-stats.json").read_text())
    assert [
        round(stats[arm]["near_trims"]["cost_of_trims"], 4) for arm in ("guard-1GiB", "guard-1GiB-250", "guard-2GiB")
    ] == [0.0159, 0.0104, 0.0027]
    assert round(stats["guard-2GiB"]["block_median"]["ratio"], 3) == 1.012
    release = json.loads((results / "cache-guard-gil-stats-vs-torch-release.json").read_text())["guard-1GiB"]
    assert release["paired_median"]["interval_95"][0] < 1 < release["paired_median"]["interval_95"][1]


def test_the_stop_24_run_holds_what_the_docs_quote():
    """docs/cache-guard.md quotes this committed run (2026-12-04):
    the 2 GiB guard over 80 rounds, memory bounded, its trims' cost resolved under 1 %, the whole-arm
    block-ratio median within 1 % by its point estimate only."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-2026-12-04"
    summary = json.loads((results / "cache-guard-2GiB-summary.json").read_text())
    arms = summary["arms"]
    assert summary["rounds"] == 80 and all(arm["requests"] == 8000 for arm in arms.values())
    assert arms["guard=2GiB"]["trims"] == 237
    assert [arms[arm]["torch_reserved_bytes"]["peak"] // MiB for arm in ("none", "guard=2GiB")] == [4950, 3526]
    assert [
        round(arms[arm]["torch_reserved_bytes"]["after_request"]["mean"] / MiB) for arm in ("none", "guard=2GiB")
    ] == [2860, 1683]
    assert (
        arms["guard=2GiB"]["torch_reserved_bytes"]["peak"] < (2032 + 2048) * MiB
    )  # one request from empty + the bound
    stats = json.loads((results / "cache-guard-2GiB-stats.json").read_text())["guard-2GiB"]
    block = stats["block_median"]
    assert (round(block["ratio"], 3), *(round(bound, 3) for bound in block["interval_95"])) == (1.005, 0.992, 1.020)
    assert block["ratio"] <= 1.01 < block["interval_95"][1]  # within 1 % by the point, not by the interval
    near = stats["near_trims"]
    assert round(near["cost_of_trims"], 4) == 0.0043 and near["cost_of_trims_interval_95"][1] < 0.01


def test_the_stop_25_three_arm_run_holds_what_the_docs_quote():
    """docs/cache-guard.md quotes this committed run (2026-12-04):
    no trimming, the 2 GiB guard and empty_cache() after every request in one run; memory bounded, the
    guard within 1 % of no trimming by every point estimate and by no interval, request by request
    resolved slower than it, and resolved faster than empty_cache()."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-2026-12-04"
    summary = json.loads((results / "cache-guard-3arms-summary.json").read_text())
    arms, done = summary["arms"], summary["done_when"]["guard=2GiB"]
    assert summary["rounds"] == 80 and all(arm["requests"] == 8000 for arm in arms.values())
    assert set(arms) == {"none", "guard=2GiB", "empty_cache"}
    assert (
        arms["guard=2GiB"]["trims"],
        arms["guard=2GiB"]["stage_end_wakes"],
        arms["empty_cache"]["empty_cache_calls"],
    ) == (250, 227, 8800)
    assert [arms[arm]["torch_reserved_bytes"]["peak"] // MiB for arm in ("none", "guard=2GiB", "empty_cache")] == [
        4950,
        3526,
        2032,
    ]
    assert [
        round(arms[arm]["torch_reserved_bytes"]["after_request"]["mean"] / MiB)
        for arm in ("none", "guard=2GiB", "empty_cache")
    ] == [2860, 1671, 178]
    assert done["peak_bounded"] and done["median_at_most_1_percent_slower"] and round(done["median_ratio"], 4) == 1.0029
    assert done["peak_over_empty_cache_bytes"] // MiB == 1494
    stats = json.loads((results / "cache-guard-3arms-stats.json").read_text())
    quoted = {
        "guard-2GiB": {
            "block_median": (1.002, 0.998, 1.023),
            "pooled_median": (1.007, 0.998, 1.018),
            "paired_median": (1.007, 1.001, 1.013),
            "mean": (1.007, 0.999, 1.014),
        },
        "empty_cache": {
            "block_median": (1.040, 1.031, 1.052),
            "pooled_median": (1.046, 1.037, 1.060),
            "paired_median": (1.036, 1.029, 1.043),
            "mean": (1.037, 1.029, 1.044),
        },
    }
    for arm, estimates in quoted.items():
        for name, (ratio, low, high) in estimates.items():
            got = stats[arm][name]
            assert (round(got["ratio"], 3), *(round(bound, 3) for bound in got["interval_95"])) == (ratio, low, high)
    guard = stats["guard-2GiB"]
    assert all(
        guard[name]["ratio"] <= 1.01 < guard[name]["interval_95"][1]
        for name in ("block_median", "pooled_median", "paired_median", "mean")
    )  # the point, not the interval
    assert guard["paired_median"]["interval_95"][0] > 1  # request by request, resolved slower than no trimming
    near = guard["near_trims"]
    assert round(near["cost_of_trims"], 4) == 0.0032 and near["cost_of_trims_interval_95"][1] < 0.01
    versus = json.loads((results / "cache-guard-3arms-stats-vs-empty-cache.json").read_text())["guard-2GiB"]
    assert all(
        versus[name]["interval_95"][1] < 1 for name in ("block_median", "pooled_median", "paired_median", "mean")
    )
    assert [round(versus[name]["ratio"], 3) for name in ("block_median", "pooled_median", "paired_median", "mean")] == [
        0.968,
        0.962,
        0.973,
        0.971,
    ]
