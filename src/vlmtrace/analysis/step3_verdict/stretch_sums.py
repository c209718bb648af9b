"""Least squares of any stretch of a memory series in O(1), from running sums.

The running sums of x, y, x², xy and y² (x and y centred on their means first, so that the sums stay small
against the differences taken from them) give, for every stretch [start, stop) of the points, the straight
line's slope and residual at once; and for every point k, the two-part shapes the explanations weigh: a line
that stops at k and stays level (a plateau) and a level that jumps once at k (a one-off step). So every
explanation and every split into growth regimes costs O(n) over the points, and nothing is built that is
larger than a few columns of them.
"""

from __future__ import annotations

import numpy as np

ROUNDING = 1e-12  # a spread this small against the sums it was read from is rounding: the column does not vary
TINY = np.finfo(np.float64).tiny


def _running(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


class StretchSums:
    """Running sums of one series, its x non-decreasing."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x = np.asarray(x, dtype=np.float64)
        self.y = np.asarray(y, dtype=np.float64)
        self.n = len(self.x)
        self.xc = self.x - self.x.mean() if self.n else self.x
        self.yc = self.y - self.y.mean() if self.n else self.y
        self.sx, self.sy = _running(self.xc), _running(self.yc)
        self.sxx, self.sxy, self.syy = (
            _running(self.xc * self.xc),
            _running(self.xc * self.yc),
            _running(self.yc * self.yc),
        )

    def line(self, start: np.ndarray | int, stop: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Residual sum of squares and slope of the least-squares line through the points [start, stop);
        a stretch whose x do not vary gets its mean level (slope 0)."""
        start, stop = np.asarray(start), np.asarray(stop)
        count = np.maximum(stop - start, 1)
        sx, sy = self.sx[stop] - self.sx[start], self.sy[stop] - self.sy[start]
        cxx = self.sxx[stop] - self.sxx[start] - sx * sx / count
        cxy = self.sxy[stop] - self.sxy[start] - sx * sy / count
        cyy = self.syy[stop] - self.syy[start] - sy * sy / count
        varies = cxx > ROUNDING * np.maximum(self.sxx[stop] - self.sxx[start], TINY)
        slope = np.where(varies, cxy / np.where(varies, cxx, 1.0), 0.0)
        return np.maximum(cyy - slope * cxy, 0.0), slope

    def _rising(self, f_sum: np.ndarray, ff_sum: np.ndarray, fy_sum: np.ndarray) -> np.ndarray:
        """Residual of a + b·f with b ≥ 0 (a rise) for many columns f given their sums Σf, Σf², Σf·y (y
        centred): inf where the best b is a fall; the mean level where f does not vary."""
        n = self.n
        cff = ff_sum - f_sum * f_sum / n
        cfy = fy_sum  # Σ y = 0: y is centred
        syy = float(self.syy[-1])
        varies = cff > ROUNDING * np.maximum(ff_sum, TINY)
        rss = np.where(varies, syy - cfy * cfy / np.where(varies, cff, 1.0), syy)
        return np.where(varies & (cfy < 0), np.inf, np.maximum(rss, 0.0))

    def plateaus(self) -> np.ndarray:
        """Per interior point k: the residual of a rise that stops at x[k] and stays level, a + b·min(x, x[k])."""
        n = self.n
        k = np.arange(1, n - 1)
        after = n - k - 1
        knee = self.xc[k]
        f_sum = self.sx[k + 1] + after * knee
        ff_sum = self.sxx[k + 1] + after * knee * knee
        fy_sum = self.sxy[k + 1] + knee * (self.sy[n] - self.sy[k + 1])
        return self._rising(f_sum, ff_sum, fy_sum)

    def steps(self) -> np.ndarray:
        """Per interior point k: the residual of a level that jumps once, at the first point with x ≥ x[k]."""
        n = self.n
        first = np.searchsorted(self.x, self.x[1:-1], "left")
        ones = (n - first).astype(np.float64)
        return self._rising(ones, ones, self.sy[n] - self.sy[first])
