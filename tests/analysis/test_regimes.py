"""Growth regimes: a component's settled levels split where their rate per request changes, the verdict's
rate read from the current regime, and where it began (onset) or where a rise stopped."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import MiB, Scenario

from conftest import analyse, verdict
from vlmtrace import semconv as sc
from vlmtrace.analysis.step3_verdict import regimes
from vlmtrace.analysis.wording import headline

X = np.arange(1, 241, dtype=np.float64)
T_NS = (1_760_000_000 * 10**9 + X * 2e9).astype(np.int64)
NOISE = np.random.default_rng(7).normal(0, 0.5 * MiB, len(X))


@pytest.mark.parametrize(
    ("levels", "starts", "rates"),
    [
        (2e9 + MiB * X, [1], [1.0]),
        (2e9 + 2 * MiB * np.maximum(X - 120, 0), [1, 121], [0.0, 2.0]),
        (2e9 + 0.5 * MiB * X + 2 * MiB * np.maximum(X - 120, 0), [1, 121], [0.5, 2.5]),
        (2e9 + 2 * MiB * np.minimum(X, 150), [1, 150], [2.0, 0.0]),
    ],
)
def test_the_levels_split_where_the_rate_changes(levels, starts, rates):
    found = regimes.split(X, levels + NOISE, T_NS)
    assert [int(regime.first_request) for regime in found] == pytest.approx(starts, abs=3)
    assert [regime.rate.slope / MiB for regime in found] == pytest.approx(rates, abs=0.05)


def test_a_level_that_jumped_once_keeps_one_regime_its_rate_unchanged():
    assert len(regimes.split(X, 2e9 + 64 * MiB * (X > 100) + NOISE, T_NS)) == 1


def test_a_leak_whose_rate_wanders_with_its_inputs_stays_one_regime():
    rng = np.random.default_rng(3)
    levels = 2e9 + np.cumsum(2 * MiB * rng.pareto(3.0, len(X)))
    assert len(regimes.split(X, levels, T_NS)) == 1


def test_a_leak_that_began_halfway_is_read_from_its_onset_with_its_rate_now(journal):
    path, _ = journal(
        Scenario(
            requests=240,
            rates={"tensor": 0.0},
            rate_changes={"tensor": ((120, 2 * MiB),)},
            stages={"tensor": sc.STAGE_VISION_FORWARD},
            seed=4,
        )
    )
    analysis = analyse(path)
    found = verdict(analysis, "tensor")
    assert found.klass == "tensor_leak" and found.evidence["decision"]["rule"] == "GROWING_SINCE"
    assert abs(found.onset["request"] - 120) <= 12
    assert abs(found.slope_bytes_per_request - 2 * MiB) <= 0.1 * 2 * MiB
    low, high = found.slope_interval_bytes_per_request
    assert low <= found.slope_bytes_per_request <= high
    assert [regime["slope_bytes_per_request"] < 0.1 * MiB for regime in found.regimes] == [True, False]
    assert f"growing since request ~{found.onset['request']:,} (" in headline(analysis.summary)[0]
    assert "flat before" in headline(analysis.summary)[0]
    # the time to run out of memory comes from the rate now, not the run's average (half of it)
    (device,) = analysis.summary.devices
    assert abs(device["slope_bytes_per_request"] - 2 * MiB) <= 0.1 * 2 * MiB
    assert analysis.summary.requests_to_oom == device["headroom_bytes"] / device["slope_bytes_per_request"]


def test_a_leak_that_stopped_says_when_and_what_it_kept(journal):
    path, _ = journal(
        Scenario(
            requests=240,
            rates={"cache": 2 * MiB},
            rate_changes={"cache": ((170, 0.0),)},
            stages={"cache": sc.STAGE_VISION_FORWARD},
            seed=5,
        )
    )
    found = verdict(analyse(path), "cache")
    assert found.klass == "no_growth" and found.plateau
    assert abs(found.stopped["request"] - 170) <= 12
    assert abs(found.stopped["kept_bytes"] - 2 * MiB * 170) <= 0.15 * 2 * MiB * 170
    assert "stopped rising at request ~" in found.evidence["plateau_reason"]
    assert abs(found.slope_bytes_per_request) < 0.1 * MiB
