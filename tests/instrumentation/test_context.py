"""OpenTelemetry context across LMDeploy's event-loop thread and the vision encoder's executor."""

from __future__ import annotations

import threading

from lmdeploy import GenerationConfig

from tests.instrumentation.conftest import image, parent_of, spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation.vision import ContextCarryingExecutor


def test_work_in_the_encoder_executor_runs_in_the_vision_span(traced, exporter, cpu_pipeline, monkeypatch):
    encoder = cpu_pipeline.async_engine.vl_encoder
    model = encoder.model
    original = model.preprocess
    seen = {}

    def preprocess_in_executor(*args, **kwargs):
        seen["thread"] = threading.current_thread().name
        with traced.tracing.provider().get_tracer("test").start_as_current_span("inside executor"):
            return original(*args, **kwargs)

    monkeypatch.setattr(model, "preprocess", preprocess_in_executor)
    cpu_pipeline(("describe", image(120, 80)), gen_config=GenerationConfig(max_new_tokens=2))
    assert seen["thread"] != threading.current_thread().name
    (inner,) = spans_by_name(exporter)["inside executor"]
    assert parent_of(inner, exporter).name == sc.SPAN_VISION_PREPROCESS
    assert isinstance(encoder.executor, ContextCarryingExecutor)


def test_uninstrument_gives_the_encoder_its_own_executor_back(exporter, cpu_pipeline):
    from opentelemetry.sdk.trace import TracerProvider

    import vlmtrace

    encoder = cpu_pipeline.async_engine.vl_encoder
    vlmtrace.instrument(tracer_provider=TracerProvider(), journal=None, sample_interval_ms=0)
    cpu_pipeline(("describe", image(50, 50)), gen_config=GenerationConfig(max_new_tokens=1))
    assert isinstance(encoder.executor, ContextCarryingExecutor)
    inner = encoder.executor.inner
    vlmtrace.uninstrument()
    assert encoder.executor is inner


def test_requests_from_two_caller_threads_join_their_own_pipeline_spans(traced, exporter, cpu_pipeline):
    def call(name):
        with traced.tracing.provider().get_tracer("test").start_as_current_span(name):
            cpu_pipeline([("describe", image(60, 60))] * 2, gen_config=GenerationConfig(max_new_tokens=3))

    threads = [threading.Thread(target=call, args=(f"caller-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = spans_by_name(exporter)
    for i in range(2):
        (caller,) = spans[f"caller-{i}"]
        trace_requests = [r for r in spans["chat tiny-qwen2vl"] if r.context.trace_id == caller.context.trace_id]
        assert len(trace_requests) == 2
        assert {parent_of(r, exporter).name for r in trace_requests} == {sc.SPAN_PIPELINE_INFER}
