"""The observed service comes first: our failures stay ours, its failures stay its own."""

from __future__ import annotations

import json
import logging

from lmdeploy import GenerationConfig
from opentelemetry.trace import StatusCode

from tests.instrumentation.conftest import finished, image, spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation import vision

GEN = GenerationConfig(max_new_tokens=4, top_k=1)


def test_attribute_extraction_that_breaks_costs_attributes_not_the_request(
    traced, exporter, cpu_pipeline, monkeypatch, caplog
):
    def moved_internals(encoder, messages):
        raise KeyError("image_size")

    monkeypatch.setattr(vision, "_image_attributes", moved_internals)
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        for _ in range(3):
            out = cpu_pipeline(("describe", image(100, 100)), gen_config=GEN)
            assert out.generate_token_len == 4
    spans = spans_by_name(exporter)
    assert len(spans[sc.SPAN_VISION_PREPROCESS]) == 3
    assert all(sc.VISION_PIXELS not in s.attributes for s in spans[sc.SPAN_VISION_PREPROCESS])
    assert all(s.attributes[sc.STAGE] == sc.STAGE_VISION_PREPROCESS for s in spans[sc.SPAN_VISION_PREPROCESS])
    warnings = [r for r in caplog.records if "moved_internals" in r.getMessage()]
    assert len(warnings) == 1


def test_a_failing_request_keeps_its_error_and_its_span_says_so(traced, exporter, cpu_pipeline):
    too_long = "word " * 3000  # beyond session_len=2048: LMDeploy's own RequestError
    out = cpu_pipeline(too_long, gen_config=GEN)
    assert out.finish_reason == "error"
    (request,) = spans_by_name(exporter)["chat tiny-qwen2vl"]
    assert request.status.status_code == StatusCode.ERROR
    assert "RequestError" in request.status.description


def test_prompt_and_response_text_are_recorded_only_when_asked(exporter, cpu_pipeline):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    import vlmtrace

    for capture in (False, True):
        exporter.clear()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        vlmtrace.instrument(tracer_provider=provider, journal=None, sample_interval_ms=0, capture_content=capture)
        try:
            cpu_pipeline(("a secret prompt", image(64, 64)), gen_config=GEN)
        finally:
            vlmtrace.uninstrument()
        recorded = [v for s in finished(exporter) for v in s.attributes.values()]
        assert any("a secret prompt" in str(v) for v in recorded) is capture
        assert not any(isinstance(v, bytes) for v in recorded)
        (request,) = [s for s in finished(exporter) if s.name == "chat tiny-qwen2vl"]
        if capture:  # as the GenAI conventions give them
            (asked,) = json.loads(request.attributes[sc.GEN_AI_INPUT_MESSAGES])
            assert asked["role"] == "user" and {"type": "text", "content": "a secret prompt"} in asked["parts"]
            assert {"type": "image"} in asked["parts"]  # an image part, never its data
            (answer,) = json.loads(request.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
            assert answer["role"] == "assistant" and answer["finish_reason"] == "length"
            assert answer["parts"][0]["type"] == "text" and isinstance(answer["parts"][0]["content"], str)
        else:
            assert sc.GEN_AI_INPUT_MESSAGES not in request.attributes
            assert sc.GEN_AI_OUTPUT_MESSAGES not in request.attributes
