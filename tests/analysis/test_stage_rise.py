"""A stage that keeps rising while the rest of a young process settles (analysis/step3_verdict/stage_rise.py): the
cases it must separate, on charges per window shaped as the H200 recorded them
(docs/gpu.md): LMDeploy's PyTorch-engine warm-up ~1 MiB per request in `vision.preprocess` for
its first ~70 requests, then nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vlmtrace.analysis.step3_verdict.stage_rise import steady_stage_rise

MiB = 1 << 20
REQUESTS = 120
X = np.arange(REQUESTS + 1, dtype=float)  # one settled point per request, the first before any
WARMUP = np.where(np.arange(REQUESTS) < 72, 1.0 * MiB, 0.0)  # per window, stopping at request 72
MIN_RATE = 128 * 1024


def _windows(**stages: np.ndarray) -> pd.DataFrame:
    noise = np.random.default_rng(7).normal(0, 16 * 1024, (REQUESTS, len(stages)))
    return pd.DataFrame(np.column_stack(list(stages.values())) + noise, columns=list(stages))


def test_a_steady_stage_beside_a_settling_warmup_is_named_with_its_own_rate():
    rise = steady_stage_rise(
        _windows(**{"request.prompt": np.full(REQUESTS, 0.5 * MiB), "vision.preprocess": WARMUP}), X, MIN_RATE
    )
    assert rise is not None and rise.stage == "request.prompt"
    assert abs(rise.fit.slope - 0.5 * MiB) <= 0.05 * MiB  # the process's own would be ~1.1 MiB per request
    assert rise.rest_last_rate < 0.6 * rise.rest_first_rate


def test_warmup_in_the_same_stage_separates_nothing():
    """The warm-up and a slow leak both in vision.preprocess: the rest shows no warm-up of its own."""
    assert (
        steady_stage_rise(
            _windows(**{"vision.preprocess": WARMUP + 0.5 * MiB, "engine.forward": np.zeros(REQUESTS)}), X, MIN_RATE
        )
        is None
    )


def test_a_stage_that_slows_down_is_warmup_too():
    slowing = np.where(np.arange(REQUESTS) < 60, 1.0 * MiB, 0.2 * MiB)
    assert steady_stage_rise(_windows(**{"vision.forward": slowing, "vision.preprocess": WARMUP}), X, MIN_RATE) is None


def test_two_stages_rising_alike_name_neither():
    steady = np.full(REQUESTS, 0.5 * MiB)
    assert (
        steady_stage_rise(
            _windows(**{"vision.forward": steady, "engine.forward": 0.8 * steady, "vision.preprocess": WARMUP}),
            X,
            MIN_RATE,
        )
        is None
    )


def test_a_rate_under_the_components_floor_is_no_rise():
    assert (
        steady_stage_rise(
            _windows(**{"request.prompt": np.full(REQUESTS, 100 * 1024.0), "vision.preprocess": WARMUP}), X, MIN_RATE
        )
        is None
    )


def test_the_rate_is_fitted_from_where_the_rest_settled():
    """At 8 in flight (pt-host-vision.forward-8x120-1MiB) the warm-up also lands in
    the leak's stage, until the rest of the process settles: fitted over the whole run the stage's rate
    would carry it, from the settled point on it is the leak's."""
    windows = 15  # pipeline calls of 8 requests
    x = np.arange(windows + 1, dtype=float) * 8
    settling = np.where(np.arange(windows) < 10, 6.0 * MiB, 0.0)  # the rest's warm-up, per call
    leak = np.full(windows, 8.0 * MiB) + np.where(np.arange(windows) < 10, 2.0 * MiB, 0.0)  # 1 MiB a request
    rise = steady_stage_rise(pd.DataFrame({"vision.forward": leak, "engine.forward": settling}), x, MIN_RATE)
    assert rise is not None and rise.stage == "vision.forward"
    assert rise.fit.slope == 1.0 * MiB  # over the whole run: ~1.2 MiB a request


def _spread_warmup(windows: int, leak_per_call: float) -> pd.DataFrame:
    """200 requests at 8 in flight (pt-host-engine-8x200-1MiB): LMDeploy's warm-up
    still rising at the run's end, ~0.05-0.3 MiB per request in each of four stages, and a leak in one."""
    rng = np.random.default_rng(11)
    spread = {
        stage: rng.normal(rate * 8 * MiB, 0.05 * MiB, windows)
        for stage, rate in (
            ("vision.preprocess", 0.3),
            ("vision.forward", 0.2),
            ("request", 0.15),
            ("request.prompt", 0.05),
        )
    }
    return pd.DataFrame({"engine.forward": np.full(windows, leak_per_call), **spread})


def test_a_stage_that_stands_out_needs_no_settled_rest():
    """Three times the next stage's growth: over 160-240 requests at 8-16 in flight the warm-up is spread
    over the stages (no negative's top stage held 1.8 times the next), a leak's stage held 3.1-16 times."""
    windows = 25
    x = np.arange(windows + 1, dtype=float) * 8
    rise = steady_stage_rise(_spread_warmup(windows, 8.0 * MiB), x, MIN_RATE)
    assert rise is not None and rise.stage == "engine.forward" and not rise.rest_settling
    assert abs(rise.fit.slope - 1.0 * MiB) <= 0.05 * MiB  # fitted over the whole run: no settled point
    assert rise.levels.shape == x.shape


def test_a_stage_just_ahead_of_an_unsettled_warmup_is_not_named():
    """Twice the next stage's (enough beside a settled rest) is not enough beside a rest still rising."""
    windows = 25
    x = np.arange(windows + 1, dtype=float) * 8
    assert steady_stage_rise(_spread_warmup(windows, 2.5 * 0.3 * 8 * MiB), x, MIN_RATE) is None
