"""The live suspicion in the served process applies the analyzer's significance rule: on the same settled
levels it agrees with `robust.theil_sen` and `significance.is_significant`, and it suspects a steady rise, not a
flat level, a one-off step at the start, or growth below the component's floor."""

from __future__ import annotations

import numpy as np
import pytest

from vlmtrace import semconv as sc
from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.rules import HOST_MIN_LEAK_RATE, YOUNG_CLASS_REQUESTS
from vlmtrace.analysis.step3_verdict.significance import is_significant
from vlmtrace.capture import suspicion

MiB = 1 << 20


@pytest.mark.parametrize(
    "rate, noise",
    [(0, 2 * MiB), (MiB, 256 << 10), (256 << 10, 4 * MiB), (64 << 10, 1 << 10), (2 * MiB, 40 * MiB), (-MiB, 128 << 10)],
)
def test_the_fit_and_the_rule_are_the_analyzers(rate, noise):
    rng = np.random.default_rng(rate % 97 + noise % 89)
    x = np.arange(1.0, 61.0)
    y = 3e9 + rate * x + rng.normal(0, noise, x.size)
    mine = suspicion.theil_sen(list(x), list(y))
    theirs = theil_sen(x, y)
    assert mine.slope == pytest.approx(theirs.slope) and mine.low == pytest.approx(theirs.low)
    assert mine.noise == pytest.approx(theirs.noise)
    floor = HOST_MIN_LEAK_RATE
    assert suspicion.significant(mine, floor) == is_significant(theirs, float(x[-1] - x[0]), floor)


def _fed(levels) -> tuple[suspicion.Suspicion, list[list[str]]]:
    live = suspicion.Suspicion(fit_every_s=0)
    said = []
    for done, level in enumerate(levels, start=1):
        live.add(done - 1, {sc.MEM_HOST_RSS: level + 5 * MiB})  # a transient read while the request ran
        said.append(live.add(done, {sc.MEM_HOST_RSS: level}))
    return live, said


@pytest.fixture
def turbomind(monkeypatch):
    """A TurboMind process: host memory without LMDeploy's PyTorch-engine warm-up."""
    monkeypatch.setattr(suspicion, "host_warms_up", lambda: False)


def test_a_steady_host_rise_is_suspected_once_it_is_worth_a_verdict(turbomind):
    _, said = _fed([2e9 + MiB * request for request in range(60)])
    first = next(index for index, names in enumerate(said) if names)
    assert said[first] == ["host"]
    assert first == suspicion.MIN_POINTS - 1  # judged once half the window is in


def test_flat_levels_a_step_at_the_start_and_slow_growth_are_not_suspected():
    rng = np.random.default_rng(1)
    flat = 2e9 + rng.normal(0, MiB, 80)
    step = np.where(np.arange(80) < 3, 2e9, 2.2e9)
    filled = 2e9 + np.minimum(np.arange(80), 12) * 4 * MiB  # a cache filling to the largest input, then level
    slow = 2e9 + 64 * 1024 * np.arange(80)  # under the host floor of 128 KiB a request
    for levels in (flat, step, slow, filled):
        _, said = _fed(list(levels))
        assert not any(said), levels[:5]


def test_a_young_pytorch_engine_process_host_warm_up_is_no_suspicion(monkeypatch):
    """LMDeploy's own host warm-up (~1 MiB a request over a PyTorch-engine process's first requests) opens no
    window, as the analyzer calls it no leak; the same rise that goes on past YOUNG_CLASS_REQUESTS is suspected
    from there, and one faster than WARMUP_HOST_RATE at once."""
    monkeypatch.setattr(suspicion, "host_warms_up", lambda: True)
    young = YOUNG_CLASS_REQUESTS
    warm_up = [2e9 + MiB * min(request, young - 10) for request in range(400)]
    _, said = _fed(warm_up)
    assert not any(said)
    _, said = _fed([2e9 + MiB * request for request in range(400)])
    first = next(index for index, names in enumerate(said) if names)
    assert said[first] == ["host"] and first > young
    _, said = _fed([2e9 + 3 * MiB * request for request in range(60)])
    assert next(index for index, names in enumerate(said) if names) == suspicion.MIN_POINTS - 1


def test_the_window_is_fitted_at_most_once_a_second(turbomind):
    live = suspicion.Suspicion()
    said = [live.add(done, {sc.MEM_HOST_RSS: 2e9 + MiB * done}) for done in range(1, 60)]
    assert not any(said)  # the first fit came before half the window, the next is a second away
    assert live.grows("host")


def test_a_component_forgotten_after_a_window_needs_a_new_window_of_points(turbomind):
    live, said = _fed([2e9 + MiB * request for request in range(40)])
    assert said[-1] == ["host"]
    live.forget("host")
    assert live.fit("host") is None and not live.grows("host")


@pytest.mark.parametrize("fitted, suspected", [(suspicion.CAPTURABLE, frozenset()), (None, frozenset({"native"}))])
def test_native_growth_is_judged_only_where_every_component_is_fitted(fitted, suspected):
    """Native GPU memory has no allocation sites: a capture window never serves it, so it is fitted only for
    detail sampling (`fitted=None`), which keeps every request's detail while anything grows."""
    live = suspicion.Suspicion(fit_every_s=0, fitted=fitted)
    for done in range(1, 61):
        live.add(done, {sc.MEM_NATIVE: 8e9 + 8 * MiB * done})
    assert live.growing == suspected
