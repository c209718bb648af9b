"""The stage a capture window's allocation sites place a growth in, where the spans alone cannot name one.

Spans that run together (requests in flight on several threads, the PyTorch engine's preprocessing beside
its forward passes) share each change of a component between them, and the trace may not tell which of two
stages held the memory (naming.named_stage). A capture window saw the allocations themselves: each site
carries the stage whose wrapped LMDeploy function its stack passed through (vlmtrace/capture/sites.py).
Where the sites of one stage explain most of the verdict's rate, far more than any other stage's, and the
spans saw that stage keep memory too, that stage is named, and the evidence says the sites named it.
"""

from __future__ import annotations

import pandas as pd

from vlmtrace.analysis.rules import SEPARATION, SITE_STAGE_EXPLAINS
from vlmtrace.analysis.step1_loading.column_keys import NO_SPAN


def site_stage(sites: list[dict], slope: float, mine: pd.DataFrame) -> tuple[str, dict] | None:
    """The stage and its evidence (`stage_from_sites`), or None. `sites`: the component's latest capture
    window's sites; `slope`: the verdict's rate, bytes per request; `mine`: the bytes each stage retained."""
    if slope <= 0:
        return None
    by_stage: dict[str, float] = {}
    for site in sites:
        if site["stage"] is not None and site["bytes_per_request"]:
            by_stage[site["stage"]] = by_stage.get(site["stage"], 0.0) + site["bytes_per_request"]
    ranked = sorted(by_stage.items(), key=lambda item: item[1], reverse=True)
    if not ranked or ranked[0][0] == NO_SPAN:
        return None
    stage, explained = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0.0
    kept = mine.loc[mine["stage"] == stage, "retained_bytes"]
    if explained < SITE_STAGE_EXPLAINS * slope or explained < SEPARATION * runner_up or not (kept > 0).any():
        return None
    return stage, {"stage": stage, "explains": explained / slope}
