"""Each verdict's allocation sites: the capture windows of its process and component (readers/captures.py)
joined to the stage the verdict names, largest first, and how much of the verdict's rate they explain.

A site belongs to a stage when its allocation's stack passed through that stage's wrapped LMDeploy
function (vlmtrace/capture/sites.py): an allocation made while that stage's span was current, on the
thread running its work. Where the verdict names a stage and no site of the window has it, every site
is listed and the note says so. Of several windows, the latest is read. A verdict of no leak lists no sites,
even where the live rule opened a window (its note says so). Native GPU memory has no sites:
the note says so, and the stage and the driver stand as the verdict gives them.
"""

from __future__ import annotations

import os

from vlmtrace.analysis import registry
from vlmtrace.analysis.readers.captures import Capture, latest_window
from vlmtrace.analysis.rules import SITES_EXPLAIN
from vlmtrace.analysis.summary import Verdict
from vlmtrace.analysis.units import format_bytes

NATIVE_NOTE = (
    "no allocation sites are available for native GPU memory (TurboMind's pool, NCCL, CUDA libraries): "
    "the stage and the input driving it are what the trace says"
)
NO_WINDOW_NOTE = (
    "no capture window ran for it (capture off, no journal, or the growth was not suspected while "
    "the process ran: `vlmtrace capture --pid` opens one by hand)"
)
NOT_BORNE_OUT_NOTE = (
    "a capture window ran while growth was suspected, which the whole run does not bear out: its sites are "
    "in the journal's capture record"
)
OUTSIDE_PYTHON_NOTE = (
    "the rest is outside Python's heap (memory a C extension or native library takes): tracemalloc has no site for it"
)


def attach_sites(verdicts: list[Verdict], captures: list[Capture], labels: list[str]) -> None:
    """Fill each verdict's `allocation_sites`, `allocation_sites_explained` and `allocation_sites_note`."""
    for verdict in verdicts:
        capture = latest_window(
            [item for item in captures if labels[item.process] == verdict.process], verdict.component
        )
        if verdict.component == "native":
            verdict.allocation_sites_note = NATIVE_NOTE if registry.is_leak(verdict.klass) else None
            continue
        if capture is None:
            verdict.allocation_sites_note = NO_WINDOW_NOTE if registry.is_leak(verdict.klass) else None
            continue
        if not registry.is_leak(verdict.klass) and verdict.klass != "inconclusive":
            # the live rule suspected growth that the whole run does not bear out (a warm-up, a cache filling):
            # its sites stay in the journal's capture record, not beside a verdict of no leak
            verdict.allocation_sites_note = NOT_BORNE_OUT_NOTE
            continue
        joined = [site for site in capture.sites if verdict.stage is not None and site["stage"] == verdict.stage]
        notes = []
        if verdict.stage is not None and not joined:
            notes.append(f"none of the window's sites was allocated inside {verdict.stage}: all are listed")
        sites = joined or capture.sites
        verdict.allocation_sites = sites
        rate = verdict.slope_bytes_per_request
        explained = sum(site["bytes_per_request"] or 0.0 for site in sites)
        verdict.allocation_sites_explained = explained / rate if rate > 0 else None
        if (
            verdict.component == "host"
            and verdict.allocation_sites_explained is not None
            and verdict.allocation_sites_explained < SITES_EXPLAIN
        ):
            notes.append(OUTSIDE_PYTHON_NOTE)
        window = (
            f"a {capture.tool} window of {capture.requests} requests ({capture.reason}, stopped by "
            f"{capture.stopped_by})" + (f"; its torch snapshot: {capture.snapshot}" if capture.snapshot else "")
        )
        verdict.allocation_sites_note = "; ".join([window, *notes])


def site_clause(verdict: Verdict) -> str:
    """`, allocated at qwen2.py:211 in `preprocess` (3.0 MiB per request, 98% of the rate)` for the first
    site; nothing where the verdict has none."""
    if not verdict.allocation_sites:
        return ""
    site = verdict.allocation_sites[0]
    function = site["function"].rsplit(".", 1)[-1]
    text = f", allocated at {os.path.basename(site['file'])}:{site['line']} in `{function}`"
    details = []
    if site["bytes_per_request"] is not None:
        details.append(f"{format_bytes(site['bytes_per_request'])} per request in the capture window")
    if verdict.allocation_sites_explained is not None:
        details.append(f"the sites listed explain {verdict.allocation_sites_explained:.0%} of the rate")
    return text + (f" ({', '.join(details)})" if details else "")
