"""The live suspicion: each memory component's settled level over a rolling window of requests, judged by
the analyzer's significance rule with the numbers of `analysis/rules.py`.

A point is a component's lowest reading since the previous point, taken at a sample in which requests
ended (the level they left behind, without the transients of the requests in flight). Once the window holds
MIN_POINTS points, the first WARMUP_FRACTION of them is left out and the Theil–Sen slope of the rest is fitted
against requests completed: a component is suspected when its slope is above zero with 95 % confidence,
at least the component's `min_leak_rate`, and its rise over the window is worth MIN_GROWTH_BYTES and
NOISE_MULTIPLE times the noise around the line (`step3_verdict.significance.is_significant`, whose numbers these
are). Host memory follows the analyzer's rule for LMDeploy's own warm-up: outside a TurboMind process, host
growth slower than WARMUP_HOST_RATE within the first YOUNG_CLASS_REQUESTS requests is no suspicion (only the
levels after them are fitted). It runs in the served process, where the analyzer's numpy and pandas may not be installed: the fit
is plain Python over at most WINDOW_POINTS points (tests/capture/test_suspicion.py holds it to the
analyzer's `robust.theil_sen` and `is_significant`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from vlmtrace import semconv as sc
from vlmtrace.analysis import registry, rules

WINDOW_POINTS = 64  # settled levels kept per component: 2 016 pairs to fit, ~1 ms of the sampler's thread
FIT_EVERY_S = 1.0  # a component is fitted at most this often (a busy service ends requests at every sample)
# Points before the first fit: half the window, so that a warm-up or a cache filling to the largest input
# within its first requests is mostly level when judged (a verdict weighs such shapes over the whole run).
MIN_POINTS = WINDOW_POINTS // 2
Z_95 = 1.959963984540054
CAPTURABLE = ("tensor", "cache", "host")  # native GPU memory has no allocation sites to capture


@dataclasses.dataclass(frozen=True)
class Fit:
    slope: float
    low: float
    noise: float
    span: float  # requests between the first and last point fitted


def components(reading: Mapping[str, Any]) -> dict[str, float]:
    """tensor / cache / native / host from one sample's readings, as the analyzer derives them
    (`step2_preparing.tables.derive_components`); a component the sample does not read is left out."""

    def number(key: str) -> float | None:
        value = reading.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    allocated, reserved = number(sc.MEM_TORCH_ALLOCATED), number(sc.MEM_TORCH_RESERVED)
    process, native = number(sc.MEM_GPU_PROCESS), number(sc.MEM_NATIVE)
    found = {"tensor": allocated, "host": number(sc.MEM_HOST_RSS)}
    if allocated is not None and reserved is not None:
        found["cache"] = reserved - allocated
    if native is None and process is not None:
        native = process - reserved if reserved is not None else process
    found["native"] = native
    return {name: value for name, value in found.items() if value is not None and math.isfinite(value)}


def theil_sen(x: list[float], y: list[float]) -> Fit | None:
    """Median pairwise slope, the low end of Sen's 95 % interval, and the robust noise around the line."""
    n = len(x)
    slopes = sorted((y[j] - y[i]) / (x[j] - x[i]) for i in range(n) for j in range(i + 1, n) if x[j] != x[i])
    if n < 3 or not slopes:
        return None
    pairs = n * (n - 1) / 2
    spread = Z_95 * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    last = len(slopes) - 1
    low = slopes[math.floor(max(0.0, (pairs - spread) / (2 * pairs)) * last)]
    slope = _median(slopes)
    detrended = [value - slope * at for at, value in zip(x, y, strict=True)]
    middle = _median(detrended)
    noise = 1.4826 * _median([abs(value - middle) for value in detrended])
    return Fit(slope, low, noise, x[-1] - x[0])


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def host_warms_up() -> bool:
    """Whether this process's host memory may hold LMDeploy's warm-up: any engine but TurboMind (whose warm-up
    is ~45 KiB a request), as the analyzer decides it from a journal's spans."""
    return "lmdeploy.turbomind.turbomind" not in sys.modules


def significant(fit: Fit | None, min_rate: float) -> bool:
    """The analyzer's significance rule (`significance.is_significant`) on the window's fit."""
    if fit is None or fit.low <= 0 or fit.slope < min_rate:
        return False
    growth = fit.slope * fit.span
    return growth >= rules.MIN_GROWTH_BYTES and growth >= rules.NOISE_MULTIPLE * fit.noise


class Suspicion:
    """Settled levels per component, fed by the sampler with the requests completed so far."""

    def __init__(self, fit_every_s: float | None = None, fitted: Iterable[str] | None = CAPTURABLE) -> None:
        """`fitted`: the components judged, those a capture window can serve (None: every component, where
        detail sampling keeps every request's detail while any of them grows)."""
        self._fit_every_s = FIT_EVERY_S if fit_every_s is None else fit_every_s
        self._fitted = None if fitted is None else frozenset(fitted)
        self._points: dict[str, collections.deque[tuple[float, float]]] = {}
        self._lowest: dict[str, float] = {}
        self._requests = 0
        self._next_fit = 0.0  # time.monotonic() from which the components are fitted again
        self.growing: frozenset[str] = frozenset()  # the components the latest fit suspected

    def add(self, requests_completed: int, reading: Mapping[str, Any]) -> list[str]:
        """One sample; the components suspected now (only where a new settled level came in)."""
        for name, value in components(reading).items():
            self._lowest[name] = min(self._lowest.get(name, value), value)
        if requests_completed <= self._requests:
            return []
        self._requests = requests_completed
        for name, value in self._lowest.items():
            points = self._points.setdefault(name, collections.deque(maxlen=WINDOW_POINTS))
            points.append((float(requests_completed), value))
        self._lowest.clear()
        now = time.monotonic()
        if now < self._next_fit:
            return []
        self._next_fit = now + self._fit_every_s
        fitted = self._fitted
        growing = [name for name in self._points if (fitted is None or name in fitted) and self.grows(name)]
        self.growing = frozenset(growing)
        return [name for name in growing if name in CAPTURABLE]

    def fit(self, name: str) -> Fit | None:
        points = list(self._points.get(name, ()))
        if len(points) < MIN_POINTS:
            return None
        points = points[math.ceil(rules.WARMUP_FRACTION * len(points)) :]
        fit = theil_sen([x for x, _ in points], [y for _, y in points])
        if fit is not None and name == "host" and fit.slope < rules.WARMUP_HOST_RATE and host_warms_up():
            points = [(x, y) for x, y in points if x > rules.YOUNG_CLASS_REQUESTS]
            fit = theil_sen([x for x, _ in points], [y for _, y in points]) if len(points) >= MIN_POINTS else None
        return fit

    def grows(self, name: str) -> bool:
        return significant(self.fit(name), registry.BY_NAME[name].min_leak_rate)

    def forget(self, name: str) -> None:
        """Start the window again (after a capture: its own cost is no growth of the service's)."""
        self._points.pop(name, None)
        self.growing = self.growing - {name}
