"""Which input feature drives how many bytes a request retains.

The retained bytes of each settled point (its level minus the previous one) are compared with the
point's inputs (image pixels, images, tokens) by rank correlation; a feature that tracks them gets a
robust slope in bytes per unit (docs/analysis.md, "Why").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace.analysis.robust import theil_sen
from vlmtrace.analysis.rules import DRIVER_SIGNIFICANCE, MIN_CORRELATION, MIN_DRIVER_POINTS

FEATURE_UNITS = {
    "image_pixels": "pixel",
    "images": "image",
    "input_tokens": "input token",
    "output_tokens": "output token",
}


@dataclasses.dataclass
class FeatureDriver:
    feature: str
    correlation: float
    bytes_per_unit: float
    unit: str


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ranks_a = pd.Series(a).rank().to_numpy()
    ranks_b = pd.Series(b).rank().to_numpy()
    if np.std(ranks_a) == 0 or np.std(ranks_b) == 0:
        return 0.0
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def feature_drivers(levels: np.ndarray, features: pd.DataFrame) -> list[FeatureDriver]:
    """Input features whose value tracks the bytes each point retains, strongest first."""
    retained = np.diff(levels)
    drivers = []
    for feature, unit in FEATURE_UNITS.items():
        column = f"{feature}_sum"
        if column not in features:
            continue
        values = features[column].to_numpy(dtype=np.float64)[1:]
        keep = np.isfinite(values) & np.isfinite(retained)
        if keep.sum() < MIN_DRIVER_POINTS or np.ptp(values[keep]) == 0:
            continue
        correlation = _rank_correlation(values[keep], retained[keep])
        threshold = max(MIN_CORRELATION, DRIVER_SIGNIFICANCE / np.sqrt(keep.sum()))
        if correlation >= threshold:
            fit = theil_sen(values[keep], retained[keep])
            drivers.append(FeatureDriver(feature, correlation, fit.slope if fit else float("nan"), unit))
    return sorted(drivers, key=lambda driver: -driver.correlation)
