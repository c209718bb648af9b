"""The analyzer: from recorded spans and memory readings to a verdict per memory component.

The steps run in order (pipeline.py runs them; no module imports one from a later step, which
tests/analysis/test_layers.py checks):

1. step1_loading/ with readers/: read journals, OTLP JSON, Jaeger or Tempo traces and torch memory
   snapshots into one TraceData (trace_data.py): spans, memory samples, device readings as columns.
2. step2_preparing/: tables.py builds the span, request and reading tables and derives the memory
   components (tensor, cache, native, host); settle.py finds the level each request leaves behind
   without its transients; sampled.py says which readings are the background sampler's;
   span_events.py and stages.py say which stage's work ran between two readings and charge each
   change to it.
3. step3_verdict/: leaks.py fits each component's growth per request and classes it, rise_shapes.py
   reading the shape of its rise; heap_tags.py and survivors.py read the host heap's chunks by the stage
   that allocated them; stage_rise.py finds a stage that keeps rising while the rest settles; naming.py
   names the stage the verdict points at; drivers.py says which input feature the retained bytes follow;
   verdict.py assembles each component's verdict from them and says what decided it (decision.py).
4. step4_outlook/: projection.py (requests until a device runs out), empty_cache.py (what releasing
   cached memory costs), recommend.py (what to change), endings.py (how each process ended) and crash.py
   (where a process died).

Beside the steps: registry.py (the memory components and verdict classes), robust.py (Theil–Sen
line fitting), summary.py (the JSON summary, the contract other tools read), units.py and wording.py
(bytes, durations and verdicts in words), compare.py (two analysed runs side by side), and
follow.py (which files, read how far), follow_records.py (what their records say of each process) and
live.py (what `vlmtrace top` shows while a journal is being written).

Public entry points, the only names the report (vlmtrace.report) reads besides the summary:
- the analysis: `analyze`, `Analysis`, `Summary`, `Verdict`, `ComponentGrowth`, `is_leak`,
  `crash_advice`, `MIN_GROWTH_BYTES`;
- the tables the report draws: `cache_trims`, `charged_levels`, `allocated_where`, `kept_curve`,
  `HEAP_STAGES`, `MISSING_TIME`;
- two runs compared (`vlmtrace diff`): `Comparison`, `ComponentChange`, `RunSlope`, and its outcomes
  `FIXED`, `REGRESSED`, `INCONCLUSIVE`;
- a journal followed while it is written (`vlmtrace top`): `LiveView`, `ProcessNow`;
- verdicts, bytes and durations in words: `CLASS_NAMES`, `COMPONENT_NAMES`, `headline`,
  `plateau_sentence`, `stage_is_uncertain`, `format_bytes`, `format_count`, `format_seconds`.
They are imported on first use, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "analyze": ("vlmtrace.analysis.pipeline", "analyze"),
    "Analysis": ("vlmtrace.analysis.pipeline", "Analysis"),
    "Summary": ("vlmtrace.analysis.summary", "Summary"),
    "Verdict": ("vlmtrace.analysis.summary", "Verdict"),
    "ComponentGrowth": ("vlmtrace.analysis.step3_verdict.leaks", "ComponentGrowth"),
    "ProcessInfo": ("vlmtrace.analysis.trace_data", "ProcessInfo"),
    "is_leak": ("vlmtrace.analysis.registry", "is_leak"),
    "crash_advice": ("vlmtrace.analysis.crash", "crash_advice"),
    "MIN_GROWTH_BYTES": ("vlmtrace.analysis.rules", "MIN_GROWTH_BYTES"),
    "FIT_MARGIN": ("vlmtrace.analysis.rules", "FIT_MARGIN"),
    "RULES_TABLE": ("vlmtrace.analysis.rules", "TABLE"),
    "bounded_attributes": ("vlmtrace.analysis.copied", "attributes"),
    "cache_trims": ("vlmtrace.analysis.step4_outlook.empty_cache", "cache_trims"),
    "charged_levels": ("vlmtrace.analysis.step3_verdict.heap_tags", "charged_levels"),
    "allocated_where": ("vlmtrace.analysis.step3_verdict.heap_tags", "allocated_where"),
    "kept_curve": ("vlmtrace.analysis.step3_verdict.survivors", "kept_curve"),
    "HEAP_STAGES": ("vlmtrace.analysis.step3_verdict.heap_tags", "STAGES"),
    "MISSING_TIME": ("vlmtrace.analysis.step1_loading.column_keys", "MISSING_TIME"),
    "Comparison": ("vlmtrace.analysis.compare", "Comparison"),
    "ComponentChange": ("vlmtrace.analysis.compare", "ComponentChange"),
    "RunSlope": ("vlmtrace.analysis.compare", "RunSlope"),
    "FIXED": ("vlmtrace.analysis.compare", "FIXED"),
    "REGRESSED": ("vlmtrace.analysis.compare", "REGRESSED"),
    "INCONCLUSIVE": ("vlmtrace.analysis.compare", "INCONCLUSIVE"),
    "LiveView": ("vlmtrace.analysis.live", "LiveView"),
    "ProcessNow": ("vlmtrace.analysis.live", "ProcessNow"),
    "CLASS_NAMES": ("vlmtrace.analysis.wording", "CLASS_NAMES"),
    "COMPONENT_NAMES": ("vlmtrace.analysis.wording", "COMPONENT_NAMES"),
    "headline": ("vlmtrace.analysis.wording", "headline"),
    "plateau_sentence": ("vlmtrace.analysis.wording", "plateau_sentence"),
    "stage_is_uncertain": ("vlmtrace.analysis.wording", "stage_is_uncertain"),
    "format_bytes": ("vlmtrace.analysis.units", "format_bytes"),
    "format_count": ("vlmtrace.analysis.units", "format_count"),
    "format_seconds": ("vlmtrace.analysis.units", "format_seconds"),
}
__all__ = [
    "CLASS_NAMES",
    "COMPONENT_NAMES",
    "FIT_MARGIN",
    "FIXED",
    "HEAP_STAGES",
    "INCONCLUSIVE",
    "MIN_GROWTH_BYTES",
    "MISSING_TIME",
    "REGRESSED",
    "RULES_TABLE",
    "Analysis",
    "Comparison",
    "ComponentChange",
    "ComponentGrowth",
    "LiveView",
    "ProcessInfo",
    "ProcessNow",
    "RunSlope",
    "Summary",
    "Verdict",
    "allocated_where",
    "analyze",
    "bounded_attributes",
    "cache_trims",
    "charged_levels",
    "crash_advice",
    "format_bytes",
    "format_count",
    "format_seconds",
    "headline",
    "is_leak",
    "kept_curve",
    "plateau_sentence",
    "stage_is_uncertain",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    return getattr(importlib.import_module(module), attribute)
