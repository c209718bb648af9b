"""A host rise resident memory could not call, called by its allocating stage's large chunks (heap_tags.kept_rising):
at 8-16 prompts in flight each resident level also holds the work in flight, and over 110-180 requests that
scatter left steady leaks `inconclusive` or level, while the stage's chunks still in use rose at the leak's rate
(docs/analysis.md, "The leak's class from its allocating stage")."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from conftest import CPU_RUNS, GPU_RUNS, analyse
from vlmtrace.analysis.robust import Slope
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict import heap_tags
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth
from vlmtrace.analysis.wording import verdict_sentence

MiB = 1 << 20


@pytest.mark.parametrize(
    ("identifier", "stage", "resident_said", "rate"),
    [
        # 1 MiB at 16 in flight; resident memory's second half rose 0.19 MiB a request, its first 1.68
        ("pt-host-engine-16x176-1MiB", "engine.forward", "too short to tell a steady rise from warm-up", 1.0),
        # 0.5 MiB at 8 in flight, TurboMind; nearly every resident point beside a new input maximum
        ("tm-host-vision.preprocess-8x112-0.5MiB", "vision.preprocess", "lies beside a new input maximum", 0.5),
        # 0.5 MiB at 16 in flight over 168 requests; resident memory "rose, then stayed level"
        ("pt-host-engine-16x168-0.5MiB", "engine.forward", "rose, then stayed level", 0.5),
    ],
)
def test_a_steady_leak_hidden_by_the_work_in_flight_is_called_by_its_chunks(identifier, stage, resident_said, rate):
    analysis = analyse(GPU_RUNS / f"{identifier}.jsonl.gz")
    (host,) = [verdict for verdict in analysis.summary.verdicts if verdict.component == "host"]
    assert analysis.summary.leak_found and host.klass == "host_growth" and host.stage == stage
    reason = host.evidence["class_from_allocations"]
    assert reason.startswith(f"a leak by its large heap chunks, allocated in {stage}, never given back")
    assert resident_said in reason
    assert host.evidence["inconclusive_reason"] is None and host.evidence["plateau_reason"] is None
    assert abs(host.slope_bytes_per_request / MiB - rate) <= 0.1 * rate
    assert "where resident memory, with the work in flight at each reading, could not tell" in verdict_sentence(
        host, analysis.summary
    )


def test_a_cache_whose_stage_gave_its_chunks_back_is_not_called_by_them():
    """A 40 MiB cache filled before the trim: its stage's chunks were given back, and stay `inconclusive`."""
    summary = analyse(GPU_RUNS / "pt-hostlru-1x152-1MiB.jsonl.gz").summary
    (host,) = [verdict for verdict in summary.verdicts if verdict.component == "host"]
    assert host.klass == "inconclusive" and "class_from_allocations" not in host.evidence


def _series(points: int) -> SettledSeries:
    x = np.arange(1, points + 1, dtype=float) * 8
    features = pd.DataFrame({"input_tokens_max": np.full(points, 300.0)})
    return SettledSeries("idle", np.arange(points), x, (x * 1e8).astype(np.int64) + 50_000_000, features, 8.0)


def _resident(series: SettledSeries, klass: str) -> ComponentGrowth:
    fit = Slope(slope=0.6 * MiB, low=0.1 * MiB, high=1.2 * MiB, intercept=0.0, points=len(series.x), noise=8.0 * MiB)
    return ComponentGrowth(
        process=0,
        component="host",
        klass=klass,
        per_request=fit,
        per_second=None,
        growth_bytes=60 * MiB,
        plateau=False,
        plateau_reason=None,
        points=len(series.x),
        first_point=1,
        record_increase_share=None,
        tail=None,
        x=series.x,
        y=series.x * fit.slope,
        t_ns=series.t_ns,
        features=series.features,
        inconclusive_reason="too short to tell a steady rise from warm-up",
    )


def _charges(series: SettledSeries, levels: np.ndarray, stage: str) -> heap_tags.Charges:
    samples = pd.DataFrame({"process": 0, "t_ns": series.t_ns - 10_000_000})
    for name in heap_tags.STAGES:
        samples[name] = levels if name == stage else 0.0
    return heap_tags.at_settled_points(samples, series)


def test_only_chunks_that_rise_steadily_and_stay_call_a_leak():
    """Synthetic, 15 points of 8 requests at 8 in flight: a steady 0.5 MiB a request is a leak; a cache full at
    request 64, warm-up that slows down, a buffer kept once, chunks given back and a slope under a leak's rate
    are not; nor is a rise already called, one too slight for a verdict, or one where resident memory did not rise."""
    series, stage = _series(15), "engine.forward"
    requests = series.x
    leak = requests * 0.5 * MiB
    cache = np.minimum(requests, 64) * 1.0 * MiB
    warmup = 40 * MiB * (1 - np.exp(-requests / 40))
    once = np.where(requests >= 56, 64.0 * MiB, 0.0)
    given_back = np.where(requests < 64, requests, requests - 64) * 1.0 * MiB
    slight = requests * 64 * 1024.0

    def called(
        levels: np.ndarray, klass: str = "inconclusive", allocating: str | None = stage, resident_low: float = 0.1
    ) -> bool:
        resident = _resident(series, klass)
        resident.per_request = dataclasses.replace(resident.per_request, low=resident_low * MiB)
        return heap_tags.kept_rising(resident, _charges(series, levels, stage), allocating) is not None

    assert called(leak) and called(leak, "no_growth")
    assert not any(called(levels) for levels in (cache, warmup, once, given_back, slight))
    assert not called(leak, "host_growth") and not called(leak, "below_threshold")
    assert not called(leak, allocating=None)
    assert not called(
        leak, "no_growth", resident_low=-0.2
    )  # resident memory did not rise: no leak beside that interval


def test_a_prompt_stage_leak_at_sixteen_in_flight_is_called_by_its_chunks():
    """0.5 MiB a request kept in TurboMind's prompt processing at 16 in flight over 112 requests, recorded on
    the CPU with the heap counter: resident memory cannot tell it from a shape that rises at new input maxima; the prompt stage's chunks
    rose 0.5 MiB a request."""
    from vlmtrace.analysis.pipeline import analyze
    from vlmtrace.analysis.readers.detect import read_inputs

    journal = CPU_RUNS / "cpu-tm-host-prompt-16x112-0.5MiB-heap"
    summary = analyze(read_inputs([str(journal)])).summary
    (host,) = [verdict for verdict in summary.verdicts if verdict.component == "host"]
    assert summary.leak_found and host.klass == "host_growth" and host.stage == "request.prompt"
    assert "with the work in flight at each reading, could not tell (" in host.evidence["class_from_allocations"]
    assert abs(host.slope_bytes_per_request / MiB - 0.5) <= 0.05
