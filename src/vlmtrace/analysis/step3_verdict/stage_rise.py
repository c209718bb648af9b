"""A stage that keeps rising while the rest of the process settles: a leak beside a warm-up.

A young PyTorch-engine process's host memory rises by up to ~1.2 MiB per request for its first ~70–90
requests (LMDeploy's own warm-up), so the process's rise alone cannot tell a slow leak from it there
(leaks.py, the young-process rule). Read at span boundaries, the two separate by stage: the warm-up's
stages stop rising within the run, a leak's stage does not. Each stage's charges per window between
settled points (stages.py) are compared between the run's first and last thirds (the warm-up is
front-loaded: at 8 in flight it lasts ~90 of 120 requests, and halves still saw it in the second):

- the *candidate* is the stage that grew most in the last third, and it holds at least STAGE_SHARE_MIN
  of that third's growth and SEPARATION times the next stage's;
- it keeps its rate: its last third rises at least STEADY_RATIO of its first third's rate;
- the rest of the process was seen warming up: at least MIN_GROWTH_BYTES in the first third. Where the
  rest shows no warm-up of its own (the warm-up fell in the candidate's stage), nothing separates the
  two, and the young-process rule stands;
- and either the rest is settling (a last third under STEADY_RATIO of its first third's rate), or the
  candidate stands out from the warm-up on its own: CLEAR_SEPARATION times the next stage's growth. Over
  more than a hundred requests at 8 or more in flight the warm-up is spread over the stages and still
  rising (no negative's top stage held 1.8 times the next one's), while a leak's stage held 3.1 to 16 times.

The candidate's own Theil–Sen slope is then the leak's rate: the process's includes the warm-up. It is
fitted from the first settled point after which the rest of the process gains under SETTLED_SHARE of
what the candidate gains, when MIN_AFTER windows follow it: at 8 in flight the warm-up reaches the
leak's stage too, until the rest settles (~90 of 120 requests). docs/analysis.md, "Warm-up or leak",
shows recorded runs of both.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.robust import Slope, theil_sen
from vlmtrace.analysis.rules import (
    CLEAR_SEPARATION,
    MIN_AFTER,
    MIN_GROWTH_BYTES,
    MIN_STAGE_CALLS,
    PARTS,
    SEPARATION,
    SETTLED_SHARE,
    STAGE_SHARE_MIN,
    STEADY_RATIO,
)
from vlmtrace.analysis.step3_verdict.significance import is_significant


@dataclasses.dataclass(frozen=True)
class StageRise:
    stage: str
    fit: Slope  # the stage's own charges, summed, against requests completed
    share: float  # of the growth of all rising stages in the run's last third
    runner_up: str | None
    runner_up_share: float
    rest_first_rate: float  # the rest of the process, bytes per request in the first and the last part
    rest_last_rate: float
    levels: np.ndarray  # the stage's charges accumulated to each settled point (aligned with its x)
    x: np.ndarray

    @property
    def rest_settling(self) -> bool:
        return self.rest_last_rate < STEADY_RATIO * self.rest_first_rate


def _rates(charges: np.ndarray, x: np.ndarray, edge: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column: bytes per request in the first and in the last `edge` windows."""
    first_span, last_span = max(x[edge] - x[0], 1.0), max(x[-1] - x[-1 - edge], 1.0)
    return charges[1 : edge + 1].sum(axis=0) / first_span, charges[-edge:].sum(axis=0) / last_span


def _rest_settled(charges: np.ndarray, top: int) -> int:
    """The first settled point from which the rest of the process gains under SETTLED_SHARE of what the
    candidate gains, with at least MIN_AFTER windows after it; 0 where there is none."""
    rest = charges.sum(axis=1) - charges[:, top]
    for start in range(1, len(charges) - MIN_AFTER):
        mine, others = charges[start + 1 :, top].sum(), rest[start + 1 :].sum()
        if mine > 0 and others <= SETTLED_SHARE * mine:
            return start
    return 0


def steady_stage_rise(per_window: pd.DataFrame, x: np.ndarray, min_rate: float) -> StageRise | None:
    """The stage rising steadily beside a settling rest of the process, or None.

    `per_window`: one row per window between consecutive settled points, one column per stage, the bytes
    charged to it there; `x`: requests completed at each settled point (one more than the windows)."""
    charges = per_window.to_numpy(dtype=np.float64)
    if len(charges) < MIN_STAGE_CALLS or charges.shape[1] == 0:
        return None
    # Row w is the window that ends at settled point w + 1; a zero row for point 0 aligns them.
    charges = np.vstack([np.zeros(charges.shape[1]), charges])
    edge = len(x) // PARTS
    first, last = _rates(charges, x, edge)
    last_growth = last * max(x[-1] - x[-1 - edge], 1.0)
    order = np.argsort(last_growth)[::-1]
    top = int(order[0])
    rising = last_growth[last_growth > 0].sum()
    share = float(last_growth[top] / rising) if rising > 0 else 0.0
    runner_up = last_growth[order[1]] if len(order) > 1 else 0.0
    if share < STAGE_SHARE_MIN or last_growth[top] < SEPARATION * max(runner_up, 0.0):
        return None
    if per_window.columns[top] == sc.STAGE_WITHOUT_DETAIL:  # requests without stage detail are no stage
        return None
    if first[top] <= 0 or last[top] < STEADY_RATIO * first[top]:
        return None
    rest_first, rest_last = first.sum() - first[top], last.sum() - last[top]  # the rates add up
    if rest_first * max(x[edge] - x[0], 1.0) < MIN_GROWTH_BYTES:
        return None
    if rest_last >= STEADY_RATIO * rest_first and last_growth[top] < CLEAR_SEPARATION * max(runner_up, 0.0):
        return None
    rest_settling = rest_last < STEADY_RATIO * rest_first
    settled = _rest_settled(charges, top) if rest_settling else 0  # a rest still rising has no settled point
    fit = theil_sen(x[settled:].astype(np.float64), np.cumsum(charges[settled:, top]))
    if not is_significant(fit, float(x[-1] - x[0]), min_rate):
        return None
    return StageRise(
        stage=str(per_window.columns[top]),
        fit=fit,
        share=share,
        runner_up=str(per_window.columns[order[1]]) if len(order) > 1 and runner_up > 0 else None,
        runner_up_share=float(max(runner_up, 0.0) / rising),
        rest_first_rate=float(rest_first),
        rest_last_rate=float(rest_last),
        levels=np.cumsum(charges[:, top]),
        x=x.astype(np.float64),
    )
