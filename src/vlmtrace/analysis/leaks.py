"""Growth of each memory component across requests: a slope, its uncertainty, and a class.

A component grows when the Theil–Sen slope of its settled level against requests completed is
positive with 95% confidence and adds up to more than noise over the run. Growth that happens only
at requests bringing a larger input than any before (a high-water mark: the caching allocator keeping
room for the biggest image so far), or that stops in the second half of the run, is a plateau, not a leak.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from vlmtrace.analysis.robust import Slope, robust_sigma, theil_sen
from vlmtrace.analysis.settle import SettledSeries

CLASS_BY_COMPONENT = {
    "tensor": "tensor_leak",
    "cache": "cache_retention",
    "native": "native_growth",
    "host": "host_growth",
}
NO_GROWTH = "no_growth"
MIN_GROWTH_BYTES = 8 * 1024 * 1024  # growth over the whole run below this is not worth a verdict
NOISE_MULTIPLE = 3.0  # ... nor is growth within a few noise standard deviations
WARMUP_FRACTION = 0.05  # first points left out of the fit: CUDA context, workspaces, first cache fill
TAIL_FLAT_RATIO = 0.25  # a tail slope below this share of the overall slope means growth stopped
RECORD_FEATURES = ("image_pixels_max", "images_max", "input_tokens_max")
RECORD_REASON = "rises only at requests with a larger input than any before (a high-water mark)"
RELEASE_REASON = "rises, then is released again (torch.cuda.empty_cache or the allocator freeing its cache)"
LEVEL_REASON = "rose, then stayed level"


@dataclasses.dataclass
class ComponentGrowth:
    process: int
    component: str
    klass: str
    per_request: Slope
    per_second: Slope | None
    growth_bytes: float
    plateau: bool
    plateau_reason: str | None
    points: int
    first_point: int
    record_increase_share: float | None
    tail: Slope | None
    x: np.ndarray  # every point with a reading, warm-up included (the fit starts at first_point)
    y: np.ndarray
    t_ns: np.ndarray
    features: pd.DataFrame  # inputs of each point, aligned with x and y

    @property
    def grows(self) -> bool:
        return self.klass != NO_GROWTH


def new_maxima(features: pd.DataFrame, tolerance: int) -> np.ndarray:
    """Points at (or up to `tolerance` points before) a request whose input beats every earlier one."""
    record = np.zeros(len(features), dtype=bool)
    for column in RECORD_FEATURES:
        if column not in features:
            continue
        values = features[column].to_numpy(dtype=np.float64)
        filled = np.where(np.isnan(values), -np.inf, values)
        previous_max = np.concatenate([[-np.inf], np.maximum.accumulate(filled)[:-1]])
        record |= filled > previous_max
    if tolerance > 0:
        spread = record.copy()
        for shift in range(1, tolerance + 1):
            spread[:-shift] |= record[shift:]
        record = spread
    return record


def is_significant(fit: Slope | None, span_x: float) -> bool:
    if fit is None or fit.low <= 0:
        return False
    growth = fit.slope * span_x
    return growth >= MIN_GROWTH_BYTES and growth >= NOISE_MULTIPLE * fit.noise


def _plateau(x: np.ndarray, y: np.ndarray, features: pd.DataFrame, tolerance: int, fit: Slope) -> tuple[str | None, float | None, Slope | None]:
    """Why this rising series is a plateau (or None), the share of its rise at new input maxima, the tail fit.

    A high-water mark rises only where an input beats every earlier one; between such requests it is
    flat. So the slope is measured again within the stretches between new maxima only: a leak keeps
    its slope there, a high-water mark has none.
    """
    increments = np.diff(y, prepend=y[0])
    record = new_maxima(features, tolerance)
    rises = increments > 0
    total_rise = increments[rises].sum()
    share = float(increments[rises & record].sum() / total_rise) if total_rise > 0 else None
    if record[1:].any():
        within = theil_sen(x, y, groups=np.cumsum(record))
        if within is not None and not is_significant(within, x[-1] - x[0]):
            return RECORD_REASON, share, None
    half = len(x) // 2
    tail = theil_sen(x[half:], y[half:])
    if tail is not None and not tail.excludes_zero and abs(tail.slope) <= TAIL_FLAT_RATIO * max(fit.slope, 0.0):
        return "stopped rising in the second half of the run", share, tail
    return None, share, tail


def component_growth(
    process: int, component: str, levels: np.ndarray, series: SettledSeries
) -> ComponentGrowth | None:
    """Classify one component's settled levels; None when too few points carry a reading."""
    keep = np.isfinite(levels)
    if keep.sum() < 5:
        return None
    x_all, y_all, t_all = series.x[keep], levels[keep], series.t_ns[keep]
    features_all = series.features[keep].reset_index(drop=True)
    skip = max(1, int(math.ceil(WARMUP_FRACTION * len(x_all))))
    x, y, t = x_all[skip:], y_all[skip:], t_all[skip:]
    features = features_all.iloc[skip:].reset_index(drop=True)
    fit = theil_sen(x, y)
    if fit is None:
        return None
    per_second = theil_sen((t - t[0]) / 1e9, y)
    grows = is_significant(fit, x[-1] - x[0])
    tolerance = int(math.ceil(series.concurrency))
    reason, share, tail = _plateau(x, y, features, tolerance, fit) if grows else (None, None, None)
    if not grows and np.ptp(y) >= MIN_GROWTH_BYTES:
        # Not growth, yet it moved: say why — when it moved for good (a blip is not worth a sentence).
        drop = max(MIN_GROWTH_BYTES, NOISE_MULTIPLE * robust_sigma(np.diff(y)))
        drops = int((np.diff(y) <= -drop).sum())
        if drops >= 2:
            reason = RELEASE_REASON
        elif np.median(y[len(y) // 2 :]) - y[0] >= MIN_GROWTH_BYTES:
            reason, share, tail = _plateau(x, y, features, tolerance, fit)
            reason = reason or LEVEL_REASON
    plateau = reason is not None
    return ComponentGrowth(
        process=process,
        component=component,
        klass=CLASS_BY_COMPONENT[component] if grows and not plateau else NO_GROWTH,
        per_request=fit,
        per_second=per_second,
        growth_bytes=float(y[-1] - y[0]),
        plateau=plateau,
        plateau_reason=reason,
        points=len(x),
        first_point=skip,
        record_increase_share=share,
        tail=tail,
        x=x_all,
        y=y_all,
        t_ns=t_all,
        features=features_all,
    )
