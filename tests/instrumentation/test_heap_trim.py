"""LMDeploy's own heap trims (`Engine._try_mem_trim`: gc.collect() and malloc_trim(0) on the PyTorch
engine's thread, every 128 multimodal sessions): LMDeploy's real code, called as its end-of-session
callback calls it; each trim a span of its own trace with the host memory it gave back, measured in
the analysis as empty_cache calls are, and never the stage a leak is charged to."""

from __future__ import annotations

import gc
import types

import numpy as np
import pandas as pd
from lmdeploy import GenerationConfig
from lmdeploy.pytorch.engine.engine import Engine
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import vlmtrace
from tests.instrumentation.conftest import finished, image
from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.step4_outlook.empty_cache import heap_trim_cost


def _engine(trim_every: int) -> Engine:
    """An Engine with only what `_maybe_trim_multimodal_session` reads (building one needs a GPU)."""
    engine = object.__new__(Engine)
    engine._multimodal_session_trim_count = trim_every
    return engine


def _sessions_end(engine: Engine, count: int) -> None:
    for _ in range(count):
        engine._maybe_trim_multimodal_session(True)  # the end-of-session callback's own call, with images


def test_each_heap_trim_is_a_span_of_its_own_trace_with_the_host_memory_it_gave_back(traced, exporter):
    tracer = traced.tracing.provider().get_tracer("test")
    engine = _engine(trim_every=3)
    with tracer.start_as_current_span("a request whose session ended"):
        _sessions_end(engine, 7)  # trims after the 3rd and the 6th
    trims = [span for span in finished(exporter) if span.name == sc.SPAN_HEAP_TRIM]
    assert len(trims) == 2
    for trim in trims:
        assert trim.attributes[sc.STAGE] == sc.STAGE_HEAP_TRIM
        assert trim.parent is None  # housekeeping: not the request's, whichever request's callback ran it
        assert sc.MEM_HOST_RSS in trim.attributes and sc.MEM_HOST_RSS + sc.DELTA_SUFFIX in trim.attributes
    assert traced.status["lmdeploy.pytorch.engine.engine.Engine._try_mem_trim"] == "wrapped"


def test_uninstrument_leaves_the_trim_a_staticmethod():
    """OpenTelemetry's unwrap would put a plain function back, which the callback's `self._try_mem_trim()`
    then passes `self`: the next trim after uninstrument() would raise in LMDeploy's engine."""
    original = vars(Engine)["_try_mem_trim"]
    vlmtrace.instrument(tracer_provider=TracerProvider(), journal=None, sample_interval_ms=0)
    assert vars(Engine)["_try_mem_trim"] is not original
    vlmtrace.uninstrument()
    assert vars(Engine)["_try_mem_trim"] is original and isinstance(original, staticmethod)
    _sessions_end(_engine(trim_every=1), 1)  # raises TypeError if the staticmethod was lost


def test_the_analysis_measures_the_trims_and_never_names_their_stage(cpu_pipeline, tmp_path, exporter):
    """A journal of the real pipeline (TurboMind's stand-in), LMDeploy's trim called between its requests as
    the PyTorch engine's end-of-session callback calls it: the trims counted and timed, what they gave back
    read from their host readings, and their stage never charged with what the process keeps."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    vlmtrace.instrument(tracer_provider=provider, journal=str(tmp_path), sample_interval_ms=20)
    engine = _engine(trim_every=8)
    held: list[np.ndarray] = []
    try:
        for index in range(48):
            held.append(np.ones(2 << 20, dtype=np.uint8))  # 2 MiB of heap, touched: resident until freed
            cpu_pipeline(
                [("describe this image", image(64, 64, seed=index))], gen_config=GenerationConfig(max_new_tokens=2)
            )
            if (index + 1) % 8 == 0:
                held.clear()  # the sessions' buffers freed, then LMDeploy's trim hands the pages back
                gc.collect()
            _sessions_end(engine, 1)
    finally:
        vlmtrace.uninstrument()
    analysis = analyze(read_inputs([str(tmp_path)]))
    trims = analysis.summary.heap_trims
    assert trims["calls"] == 6 and trims["measured"]
    assert trims["median_duration_s"] > 0
    assert np.isfinite(trims["median_released_bytes"])
    assert sc.STAGE_HEAP_TRIM not in {verdict.stage for verdict in analysis.summary.verdicts}
    assert all(
        row["stage"] != sc.STAGE_HEAP_TRIM or row.get("retained_bytes", 0) <= 0 for row in analysis.summary.stages
    )


def test_requests_in_flight_during_a_trim_are_compared_with_the_others():
    """The engine stalls while it trims: the requests it slows are those in flight, not the next to start."""
    trims = pd.DataFrame(
        {
            "stage": [sc.STAGE_HEAP_TRIM] * 2,
            "name": [sc.SPAN_HEAP_TRIM] * 2,
            "start_ns": [100, 300],
            "end_ns": [150, 350],
            "duration_s": [0.05, 0.05],
            sc.MEM_HOST_RSS + sc.DELTA_SUFFIX: [-8e6, -6e6],
        }
    )
    starts = np.arange(0, 400, 10)  # 15 ns each, 70 where a trim ran while they did: 90-140 and 290-340
    ends = starts + np.where((starts >= 90) & (starts < 150) | (starts >= 290) & (starts < 350), 70, 15)
    requests = pd.DataFrame({"start_ns": starts, "end_ns": ends, "duration_s": (ends - starts) / 1e9})
    cost = heap_trim_cost(types.SimpleNamespace(spans=trims, requests=requests))
    assert (cost.calls, cost.median_released_bytes, cost.released_bytes) == (2, 7e6, 14e6)
    assert cost.requests_after == 12 and cost.requests_other == 28  # 6 in flight during each trim
    assert cost.latency_after_s == 70e-9 and cost.latency_other_s == 15e-9
