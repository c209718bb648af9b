"""The GenAI semantic conventions on LMDeploy 0.18's real pipeline, read back through the SDK's in-memory
exporters: `error.type` on a failed request (its span and its metrics), and the content capture modes:
prompts and responses on the request span, in a `gen_ai.client.inference.operation.details` event through
the Logs API, both or neither."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from lmdeploy import GenerationConfig
from opentelemetry import _logs
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    InMemoryLogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import StatusCode

import vlmtrace
from tests.instrumentation.conftest import finished, image, spans_by_name
from tests.instrumentation.test_metrics import collected
from vlmtrace import semconv as sc
from vlmtrace.instrumentation import request, request_attributes

GEN = GenerationConfig(max_new_tokens=4, top_k=1)
REQUEST_ERROR = "lmdeploy.serve.core.exceptions.RequestError"  # LMDeploy's own, for a prompt beyond session_len
DETAILS = "gen_ai.client.inference.operation.details"


def _tracer_provider(exporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _logs_into_memory() -> tuple[LoggerProvider, InMemoryLogRecordExporter]:
    logs = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    return provider, logs


def test_a_failed_request_names_its_error_on_its_span_its_exception_event_and_its_metrics(exporter, cpu_pipeline):
    reader = InMemoryMetricReader()
    vlmtrace.instrument(
        tracer_provider=_tracer_provider(exporter),
        meter_provider=MeterProvider(metric_readers=[reader]),
        journal=None,
        sample_interval_ms=0,
    )
    try:
        assert cpu_pipeline("word " * 3000, gen_config=GEN).finish_reason == "error"  # beyond session_len
        assert cpu_pipeline("describe", gen_config=GEN).finish_reason == "length"
    finally:
        vlmtrace.uninstrument()
    failed, answered = spans_by_name(exporter)["chat tiny-qwen2vl"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes[sc.ERROR_TYPE] == REQUEST_ERROR
    (event,) = [e for e in failed.events if e.name == "exception"]
    assert event.attributes["exception.type"] == REQUEST_ERROR  # the same name the SDK's record_exception writes
    assert sc.ERROR_TYPE not in answered.attributes and answered.status.status_code is StatusCode.UNSET

    points = collected(reader)
    durations = {attributes.get(sc.ERROR_TYPE): point.count for attributes, point in points[sc.METRIC_REQUEST_DURATION]}
    assert durations == {REQUEST_ERROR: 1, None: 1}
    assert {attributes.get(sc.ERROR_TYPE) for attributes, _ in points[sc.METRIC_REQUESTS]} == {REQUEST_ERROR, None}
    assert [a for a, _ in points[sc.METRIC_TIME_TO_FIRST_TOKEN] if sc.ERROR_TYPE in a] == []  # successes only


def test_a_request_lmdeploy_ends_with_finish_reason_error_without_raising_is_an_error_of_type_other(exporter):
    """Before 0.16 `AsyncEngine.generate(messages, …)` is the whole request, and an engine failure is an output
    with finish reason `error` rather than an exception."""
    reader = InMemoryMetricReader()
    session = vlmtrace.instrument(
        tracer_provider=_tracer_provider(exporter),
        meter_provider=MeterProvider(metric_readers=[reader]),
        journal=None,
        sample_interval_ms=0,
    )

    async def generate(messages, session_id, gen_config):
        yield SimpleNamespace(response="", generate_token_len=0, input_token_len=3, finish_reason="error")

    async def consume():
        whole_request = request.from_messages(session.telemetry, None)
        return [
            output async for output in whole_request(generate, SimpleNamespace(model_name="m"), ("hi", 7, None), {})
        ]

    try:
        assert [output.finish_reason for output in asyncio.run(consume())] == ["error"]
    finally:
        vlmtrace.uninstrument()
    (span,) = spans_by_name(exporter)["chat m"]
    assert span.status.status_code is StatusCode.ERROR and span.attributes[sc.ERROR_TYPE] == "_OTHER"
    assert [e.name for e in span.events] == []  # no exception to record
    (duration,) = collected(reader)[sc.METRIC_REQUEST_DURATION]
    assert duration[0][sc.ERROR_TYPE] == "_OTHER"


@pytest.mark.parametrize(
    "mode, on_span, in_event",
    [
        ("span_only", True, False),
        ("event_only", False, True),
        ("span_and_event", True, True),
        ("no_content", False, False),
    ],
)
def test_each_capture_mode_puts_the_prompt_and_the_response_where_it_says(
    mode, on_span, in_event, exporter, cpu_pipeline
):
    logger_provider, logs = _logs_into_memory()
    session = vlmtrace.instrument(
        tracer_provider=_tracer_provider(exporter),
        logger_provider=logger_provider,
        journal=None,
        sample_interval_ms=0,
        capture_content=mode,
    )
    try:
        assert (session.content_events is not None) is in_event  # no logger unless events are asked for
        cpu_pipeline(("a secret prompt", image(64, 64)), gen_config=GEN)
    finally:
        vlmtrace.uninstrument()
    (span,) = [s for s in finished(exporter) if s.name == "chat tiny-qwen2vl"]
    assert (sc.GEN_AI_INPUT_MESSAGES in span.attributes, sc.GEN_AI_OUTPUT_MESSAGES in span.attributes) == (on_span,) * 2
    assert any("a secret prompt" in str(v) for s in finished(exporter) for v in s.attributes.values()) is on_span

    records = [r.log_record for r in logs.get_finished_logs()]
    assert len(records) == int(in_event)
    for record in records:
        assert record.event_name == DETAILS
        assert (record.trace_id, record.span_id) == (span.context.trace_id, span.context.span_id)
        attributes = dict(record.attributes)
        for key in (
            sc.GEN_AI_OPERATION_NAME,
            sc.GEN_AI_PROVIDER_NAME,
            sc.GEN_AI_REQUEST_MODEL,
            sc.GEN_AI_RESPONSE_MODEL,
            sc.GEN_AI_USAGE_INPUT_TOKENS,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS,
            sc.GEN_AI_REQUEST_MAX_TOKENS,
        ):
            assert attributes[key] == span.attributes[key], key
        assert list(attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["length"]
        assert not any(key.startswith(("vlmtrace.", "lmdeploy.")) for key in attributes)
        (asked,) = attributes[sc.GEN_AI_INPUT_MESSAGES]  # structured values, not the span's JSON text
        assert asked["role"] == "user" and {"type": "text", "content": "a secret prompt"} in asked["parts"]
        assert {"type": "image"} in asked["parts"]  # an image part, never its data
        (answer,) = attributes[sc.GEN_AI_OUTPUT_MESSAGES]
        assert answer["role"] == "assistant" and answer["finish_reason"] == "length"
        assert answer["parts"][0]["type"] == "text" and isinstance(answer["parts"][0]["content"], str)
        assert not any(isinstance(value, bytes) for value in attributes.values())
    for scope in {r.instrumentation_scope for r in logs.get_finished_logs()}:
        assert (scope.name, scope.version, scope.schema_url) == (
            sc.INSTRUMENTATION_SCOPE,
            vlmtrace.__version__,
            sc.SCHEMA_URL,
        )


def test_a_failed_requests_event_carries_its_error_type(exporter, cpu_pipeline):
    logger_provider, logs = _logs_into_memory()
    vlmtrace.instrument(
        tracer_provider=_tracer_provider(exporter),
        logger_provider=logger_provider,
        journal=None,
        sample_interval_ms=0,
        capture_content="event_only",
    )
    try:
        cpu_pipeline("word " * 3000, gen_config=GEN)
    finally:
        vlmtrace.uninstrument()
    (record,) = [r.log_record for r in logs.get_finished_logs()]
    assert record.attributes[sc.ERROR_TYPE] == REQUEST_ERROR
    (asked,) = record.attributes[sc.GEN_AI_INPUT_MESSAGES]
    assert asked["parts"][0]["content"] == ("word " * 3000)[: request_attributes.MAX_CAPTURED_TEXT]


@pytest.mark.usefixtures("fresh_global_logger_provider")
def test_events_go_to_the_global_logger_provider_set_after_instrument(exporter, cpu_pipeline, monkeypatch):
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY")
    vlmtrace.instrument(tracer_provider=_tracer_provider(exporter), journal=None, sample_interval_ms=0)
    try:
        cpu_pipeline("before any logger provider", gen_config=GEN)  # the API's no-op logger: nowhere, no error
        logger_provider, logs = _logs_into_memory()
        _logs.set_logger_provider(logger_provider)
        cpu_pipeline("after", gen_config=GEN)
    finally:
        vlmtrace.uninstrument()
    (record,) = [r.log_record for r in logs.get_finished_logs()]
    assert record.attributes[sc.GEN_AI_INPUT_MESSAGES][0]["parts"] == ({"type": "text", "content": "after"},)
