"""Allocation sites, captured in the served process while growth is suspected, and only then (docs/capture.md).

suspicion.py keeps each component's settled levels and applies the analyzer's significance rule;
controller.py opens and closes the windows and writes their `capture` records; heap_window.py
(tracemalloc) and torch_window.py (torch's memory history) are the tools; sites.py groups what a window
kept by site and stage.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vlmtrace.capture.controller import OFF, Bounds, CaptureController
from vlmtrace.capture.suspicion import Suspicion
from vlmtrace.config import Options


def controller_for(options: Options, journal: Any, family_targets: Iterable[Any]) -> CaptureController | None:
    """The session's capture controller; None where capture is off or there is no journal to record into."""
    if options.capture == OFF or journal is None:
        return None
    bounds = Bounds(
        options.capture_window_requests,
        options.capture_window_seconds,
        options.capture_window_bytes,
        options.capture_every_s,
    )
    # Detail sampling (`detail_every`) keeps every request's detail while any component grows: all are fitted.
    suspicion = Suspicion(fitted=None) if options.detail_every > 1 else None
    return CaptureController(options.capture, bounds, journal, family_targets, suspicion)
