"""A rising series weighed against named explanations (steady leak, warm-up, high-water mark, plateau,
one-off step) by how well each fits, and the verdict that says which one decided it and which came second."""

from __future__ import annotations

import numpy as np
import pandas as pd
from synthetic import MiB, Scenario

from conftest import analyse, verdict
from vlmtrace import semconv as sc
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict import explanations as ex
from vlmtrace.analysis.step3_verdict.leaks import component_growth

CALLS, PROMPTS = 15, 8
X = np.arange(1, CALLS + 1) * float(PROMPTS)  # requests completed after each pipeline call of 8 prompts
# The largest image of each call: a new maximum at 29 % of the calls after the first.
PIXELS = np.array([4, 1, 2, 6, 3, 5, 9, 2, 4, 3, 12, 8, 7, 15, 11], dtype=float) * 100_000


def _series(mode: str = "idle", concurrency: float = 0.0) -> SettledSeries:
    features = pd.DataFrame(
        {"image_pixels_max": PIXELS, "images_max": np.ones(CALLS), "input_tokens_max": np.full(CALLS, 300.0)}
    )
    return SettledSeries(mode, np.arange(CALLS), X, (X * 1e9).astype(np.int64), features, concurrency)


def _staircase() -> np.ndarray:
    """A level that rises only at calls bringing a larger image than any before, and is flat between them."""
    record = np.concatenate([[-np.inf], np.maximum.accumulate(PIXELS)[:-1]]) < PIXELS
    noise = np.random.default_rng(3).normal(0, 64 * 1024, CALLS)
    return 2e9 + np.cumsum(np.where(record, 20 * MiB, 0.0)) + noise


def test_the_new_input_maxima_fall_at_about_a_third_of_the_calls():
    assert 0.25 <= ex.new_maxima(X, _series().features, 0.0)[1:].mean() <= 0.35


def test_a_perfect_line_is_a_leak_whatever_the_input_maxima():
    levels = 3e9 + 0.5 * MiB * X
    growth = component_growth(0, "tensor", levels, _series())
    assert growth.klass == "tensor_leak"
    assert growth.per_request.slope == 0.5 * MiB
    assert growth.weighed.exact_line and growth.weighed.fits[0].name == ex.STEADY_LEAK
    assert growth.decided_by.startswith(ex.STEADY_LEAK)


def test_a_perfect_line_is_never_withheld_by_a_rule_about_input_maxima_under_load():
    """Under load every request of a call lies within the concurrency of its largest input."""
    levels = 3e9 + 0.5 * MiB * X
    growth = component_growth(0, "tensor", levels, _series("load", concurrency=float(PROMPTS)))
    assert growth.klass == "tensor_leak", growth.inconclusive_reason


def test_a_level_flat_between_new_input_maxima_is_a_high_water_mark_though_the_maxima_are_many():
    growth = component_growth(0, "cache", _staircase(), _series())
    assert growth.klass == "no_growth" and growth.plateau
    assert growth.decided_by.startswith(ex.HIGH_WATER_MARK)
    assert growth.weighed.prefers(ex.HIGH_WATER_MARK, ex.STEADY_LEAK)


def test_a_saturating_rise_fits_warm_up_better_than_a_line():
    x = np.arange(1, 61) * 4.0
    levels = 2e9 + 200 * MiB * (1 - np.exp(-x / 40.0))
    weighed = ex.weigh(x, levels, pd.DataFrame(index=range(len(x))), 0.0)
    assert weighed.prefers(ex.WARM_UP, ex.STEADY_LEAK)


def test_one_jump_fits_a_one_off_step_better_than_a_line():
    x = np.arange(1, 41) * 4.0
    levels = 2e9 + np.where(x >= 80, 64 * MiB, 0.0) + np.random.default_rng(5).normal(0, 128 * 1024, len(x))
    weighed = ex.weigh(x, levels, pd.DataFrame(index=range(len(x))), 0.0)
    assert weighed.fits[0].name == ex.ONE_OFF_STEP
    assert weighed.prefers(ex.ONE_OFF_STEP, ex.STEADY_LEAK)


def test_a_tensor_leak_of_half_a_mib_per_request_on_the_pytorch_engine_is_called_within_120_requests(journal):
    path, _ = journal(
        Scenario(
            requests=120,
            batch=PROMPTS,
            rates={"tensor": 0.5 * MiB},
            stages={"tensor": sc.STAGE_VISION_FORWARD},
            backend="pytorch",
            continuous_sizes=True,
            seed=2,
        )
    )
    found = verdict(analyse(path), "tensor")
    assert found.klass == "tensor_leak"
    assert abs(found.slope_bytes_per_request - 0.5 * MiB) <= 0.02 * MiB


def test_every_verdict_names_the_rule_that_decided_it_the_runner_up_the_stage_and_the_rate(journal):
    path, _ = journal(
        Scenario(requests=160, batch=4, rates={"cache": 2 * MiB}, stages={"cache": sc.STAGE_VISION_FORWARD})
    )
    for found in analyse(path).summary.verdicts:
        decision = found.evidence["decision"]
        assert decision["class"] and decision["stage"] and decision["rate"]
    cache = verdict(analyse(path), "cache")
    assert cache.evidence["decision"]["explanation"] == ex.STEADY_LEAK
    assert cache.evidence["decision"]["runner_up"]["explanation"] != ex.STEADY_LEAK


def test_a_staircase_whose_first_level_holds_a_transient_far_above_the_rest_is_still_a_high_water_mark():
    """A reading taken while a late request still held a GiB of activations: every rising shape fits as a
    fall, so no explanation but the line and the high-water marks is weighed."""
    levels = _staircase()
    levels[1] += 1024 * MiB
    growth = component_growth(0, "tensor", levels, _series())
    assert {fit.name for fit in growth.weighed.fits} == {ex.STEADY_LEAK, ex.HIGH_WATER_MARK, ex.LEAK_ON_MARK}
    assert growth.klass == "no_growth" and growth.decided_by.startswith(ex.HIGH_WATER_MARK)


def test_the_plateau_and_the_step_fitted_at_every_point_match_their_least_squares_solve():
    rng = np.random.default_rng(11)
    x = np.cumsum(rng.integers(1, 5, 80)).astype(np.float64)
    y = 2e9 + 3 * MiB * np.minimum(x, x[30]) + 40 * MiB * (x >= x[55]) + rng.normal(0, MiB, len(x))
    weighed = ex.weigh(x, y, pd.DataFrame(index=range(len(x))), 0.0)
    origin = x - x[0]
    for name, columns in (
        (ex.PLATEAU, [np.minimum(origin, knee) for knee in origin[1:-1]]),
        (ex.ONE_OFF_STEP, [(origin >= jump).astype(np.float64) for jump in origin[1:-1]]),
    ):
        best = np.inf
        for column in columns:
            design = np.column_stack([np.ones_like(origin), column])
            coefficients, *_ = np.linalg.lstsq(design, y, rcond=None)
            if coefficients[1] >= 0:
                best = min(best, float(((y - design @ coefficients) ** 2).sum()))
        expected = len(x) * np.log(best / len(x)) + ex.SHAPE_PARAMETERS * np.log(len(x))
        assert abs(weighed.of(name).bic - expected) < 1e-6


def test_two_hundred_thousand_levels_between_many_input_maxima_are_weighed_without_a_dense_matrix():
    """Every explanation costs O(n) in the points: a stretch-per-level design matrix of this size would need
    hundreds of GiB."""
    n = 200_000
    rng = np.random.default_rng(4)
    x = np.arange(1, n + 1, dtype=np.float64)
    pixels = rng.pareto(1.0, n) * 1e5
    y = 2e9 + 64 * 1024 * x + rng.normal(0, MiB, n)
    weighed = ex.weigh(x, y, pd.DataFrame({"image_pixels_max": pixels}), 0.0)
    assert weighed.of(ex.LEAK_ON_MARK) is not None and weighed.fits[0].name in (ex.STEADY_LEAK, ex.LEAK_ON_MARK)
