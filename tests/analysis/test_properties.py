"""Property-based tests (hypothesis): generated settled series and whole small journals through the analyzer.

Whatever a readable journal holds, the analyzer gives a verdict and never an internal error; the shapes no
run can read two ways get their class; every verdict's rate lies within its own interval. Two settings
profiles: `ci` (the default: few examples, no deadline, so a loaded machine does not fail it) and `long`
(HYPOTHESIS_PROFILE=long, or benchmarks/property_long.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import MiB, Scenario, write_journal

from conftest import analyse
from vlmtrace import semconv as sc
from vlmtrace.analysis.registry import BY_NAME, is_leak
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict.leaks import component_growth
from vlmtrace.report.html import render_report

settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SHAPES = ("line", "onset", "stop", "step", "sawtooth", "warm-up", "high-water mark", "constant")


def _levels(shape: str, x: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    n, span = len(x), float(x[-1] - x[0]) or 1.0
    middle = x[0] + span / 2
    if shape == "line":
        return rate * x
    if shape == "onset":
        return rate * np.maximum(x - middle, 0)
    if shape == "stop":
        return rate * np.minimum(x, middle)
    if shape == "step":
        return np.where(x >= middle, 64 * MiB, 0.0)
    if shape == "sawtooth":
        return rate * (x % max(span / 4, 1.0))
    if shape == "warm-up":
        return rate * span / 4 * (1 - np.exp(-(x - x[0]) / (span / 8)))
    if shape == "high-water mark":
        return 8 * MiB * np.maximum.accumulate(rng.pareto(1.0, n))
    return np.zeros(n)


@st.composite
def settled(draw):
    """A component's settled levels: a shape, its rate, noise from 0 to 10× the rate, 3 to 5,000 points, with
    ties in requests completed, equal read times and runs of equal levels."""
    n = draw(st.integers(3, 5000))
    shape = draw(st.sampled_from(SHAPES))
    rate = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0])) * MiB
    noise = draw(st.sampled_from([0.0, 0.1, 1.0, 10.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    steps = rng.integers(0 if draw(st.booleans()) else 1, draw(st.integers(1, 16)) + 1, n)
    x = np.cumsum(steps).astype(np.float64) + 1
    t_ns = 1_760_000_000 * 10**9 + (
        np.cumsum(rng.integers(0, 3, n)) * 10**8 if draw(st.booleans()) else np.zeros(n, int)
    )
    levels = 3e9 + _levels(shape, x, rate, rng) + rng.normal(0, noise * rate, n)
    if draw(st.booleans()):
        levels = np.round(levels / (4 * MiB)) * 4 * MiB  # ties: levels read in allocator blocks
    features = pd.DataFrame(
        {
            "image_pixels_max": rng.pareto(1.5, n) * 1e5,
            "images_max": np.ones(n),
            "input_tokens_max": rng.integers(100, 900, n).astype(np.float64),
        }
    )
    series = SettledSeries(
        draw(st.sampled_from(["idle", "load"])),
        np.arange(n),
        x,
        t_ns.astype(np.int64),
        features,
        float(draw(st.sampled_from([0, 1, 8]))),
    )
    return shape, rate, noise, series, levels


@given(settled(), st.sampled_from(["tensor", "cache", "native", "host"]))
def test_any_settled_series_gets_a_class_and_a_rate_within_its_interval(case, component):
    _, _, _, series, levels = case
    growth = component_growth(0, component, levels, series)
    if growth is None:
        assert len(levels) < 5 or len(np.unique(series.x)) < 2
        return
    assert growth.klass in (BY_NAME[component].leak_class, "inconclusive", "below_threshold", "no_growth")
    fit = growth.per_request
    assert fit.low <= fit.slope <= fit.high
    for regime in growth.change.regimes:
        assert regime.rate.low <= regime.rate.slope <= regime.rate.high


@given(st.integers(80, 3000), st.sampled_from([1.0, 2.0, 4.0]), st.integers(0, 2**32 - 1))
def test_a_steady_line_with_little_noise_is_a_leak_at_its_rate(n, rate_mib, seed):
    rng = np.random.default_rng(seed)
    x = np.arange(1, n + 1, dtype=np.float64)
    levels = 3e9 + rate_mib * MiB * x + rng.normal(0, 0.5 * rate_mib * MiB, n)
    series = SettledSeries(
        "idle",
        np.arange(n),
        x,
        (1_760_000_000 * 10**9 + x * 1e9).astype(np.int64),
        pd.DataFrame({"images_max": np.ones(n)}),
        0.0,
    )
    growth = component_growth(0, "tensor", levels, series)
    assert growth.klass == "tensor_leak"
    assert abs(growth.per_request.slope - rate_mib * MiB) <= 0.1 * rate_mib * MiB


@given(st.integers(120, 3000), st.floats(0.3, 0.7), st.sampled_from([1.0, 2.0, 4.0]), st.integers(0, 2**32 - 1))
def test_a_leak_that_begins_within_the_run_is_a_leak_from_its_onset_at_its_rate_now(n, at, rate_mib, seed):
    rng = np.random.default_rng(seed)
    x = np.arange(1, n + 1, dtype=np.float64)
    onset = int(at * n)
    levels = 3e9 + rate_mib * MiB * np.maximum(x - onset, 0) + rng.normal(0, 0.5 * rate_mib * MiB, n)
    series = SettledSeries(
        "idle",
        np.arange(n),
        x,
        (1_760_000_000 * 10**9 + x * 1e9).astype(np.int64),
        pd.DataFrame({"images_max": np.ones(n)}),
        0.0,
    )
    growth = component_growth(0, "tensor", levels, series)
    assert growth.klass == "tensor_leak" and growth.change.onset is not None
    assert abs(growth.change.onset.first_request - onset) <= 0.1 * n
    assert abs(growth.per_request.slope - rate_mib * MiB) <= 0.1 * rate_mib * MiB


@given(st.integers(100, 3000), st.integers(0, 2**32 - 1))
def test_a_constant_level_with_noise_is_never_a_leak(n, seed):
    rng = np.random.default_rng(seed)
    x = np.arange(1, n + 1, dtype=np.float64)
    series = SettledSeries(
        "idle",
        np.arange(n),
        x,
        (1_760_000_000 * 10**9 + x * 1e9).astype(np.int64),
        pd.DataFrame({"images_max": np.ones(n)}),
        0.0,
    )
    growth = component_growth(0, "cache", 3e9 + rng.normal(0, MiB, n), series)
    assert not growth.grows


@st.composite
def scenarios(draw):
    component = draw(st.sampled_from(["tensor", "cache", "native", "host"]))
    requests = draw(st.integers(8, 90))
    rate = draw(st.sampled_from([0.0, 0.5, 2.0])) * MiB
    change = draw(
        st.one_of(st.none(), st.tuples(st.integers(1, requests), st.sampled_from([0.0, 1.0 * MiB, 3.0 * MiB])))
    )
    stage = draw(st.sampled_from([sc.STAGE_VISION_FORWARD, sc.STAGE_VISION_PREPROCESS, sc.STAGE_PROMPT]))
    return Scenario(
        requests=requests,
        batch=draw(st.sampled_from([1, 2, 8])),
        rates={component: rate},
        stages={component: stage},
        rate_changes={component: (change,)} if change else {},
        backend=draw(st.sampled_from(["turbomind", "pytorch"])),
        seed=draw(st.integers(0, 1000)),
        crash_at_request=draw(st.one_of(st.none(), st.integers(1, requests))),
        steady=draw(st.booleans()),
        sampled_nvml=draw(st.booleans()),
        continuous_sizes=draw(st.booleans()),
        empty_cache_every=draw(st.one_of(st.none(), st.integers(1, 10))),
    )


@settings(max_examples=max(8, settings().max_examples // 3))
@given(scenarios())
def test_any_small_journal_reads_into_a_report_with_rates_within_their_intervals(scenario):
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "run.jsonl"
        write_journal(scenario, path)
        analysis = analyse(path)
        assert "<html" in render_report(analysis)
    for found in analysis.summary.verdicts:
        low, high = found.slope_interval_bytes_per_request
        assert low <= found.slope_bytes_per_request <= high, found
        assert found.evidence["decision"]["decided_by_words"]
        if found.onset is not None and is_leak(found.klass):
            assert found.regimes and found.onset["request"] == found.regimes[-1]["start_request"]
