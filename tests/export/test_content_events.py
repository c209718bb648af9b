"""The GenAI content event through the Logs API, into the SDK's in-memory log exporter (scripts/test-newest-sdk
runs this on the newest release too): its name, its request span's context, the span's GenAI attributes and
the content as structured values."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider

import vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.export.content_events import ContentEvents
from vlmtrace.export.recorder import SpanRecorder

PROMPT = [{"role": "user", "parts": [{"type": "text", "content": "what is in it?"}, {"type": "image"}]}]
ANSWER = [{"role": "assistant", "parts": [{"type": "text", "content": "a cat"}], "finish_reason": "stop"}]
SPAN_ATTRIBUTES = {
    sc.GEN_AI_OPERATION_NAME: "chat",
    sc.GEN_AI_PROVIDER_NAME: "lmdeploy",
    sc.GEN_AI_REQUEST_MODEL: "m",
    sc.GEN_AI_USAGE_INPUT_TOKENS: 70,
    sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
    sc.ERROR_TYPE: "_OTHER",
    sc.GEN_AI_INPUT_MESSAGES: json.dumps(PROMPT),
    sc.STAGE: sc.STAGE_REQUEST,
    sc.LMDEPLOY_SESSION_ID: 3,
}


def test_an_event_carries_the_request_spans_genai_attributes_and_the_content_structured_in_its_context():
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    recorder = SpanRecorder(None, TracerProvider().get_tracer("test"))
    span = recorder.start("chat m", None, trace.SpanKind.INTERNAL, dict(SPAN_ATTRIBUTES))
    recorder.end(span)

    ContentEvents(logger_provider).emit(span, PROMPT, ANSWER)

    (emitted,) = logs.get_finished_logs()
    record = emitted.log_record
    assert record.event_name == sc.EVENT_INFERENCE_DETAILS == "gen_ai.client.inference.operation.details"
    assert (record.trace_id, record.span_id) == (span.trace_id, span.span_id)
    attributes = dict(record.attributes)
    assert {
        key: attributes[key]
        for key in (
            sc.GEN_AI_OPERATION_NAME,
            sc.GEN_AI_PROVIDER_NAME,
            sc.GEN_AI_REQUEST_MODEL,
            sc.GEN_AI_USAGE_INPUT_TOKENS,
            sc.ERROR_TYPE,
        )
    } == {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "lmdeploy",
        sc.GEN_AI_REQUEST_MODEL: "m",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 70,
        sc.ERROR_TYPE: "_OTHER",
    }
    assert sc.STAGE not in attributes and sc.LMDEPLOY_SESSION_ID not in attributes  # GenAI names only
    prompt, answer = attributes[sc.GEN_AI_INPUT_MESSAGES], attributes[sc.GEN_AI_OUTPUT_MESSAGES]
    assert json.loads(json.dumps(prompt)) == PROMPT and json.loads(json.dumps(answer)) == ANSWER  # not JSON text
    scope = emitted.instrumentation_scope
    assert (scope.name, scope.version, scope.schema_url) == (
        sc.INSTRUMENTATION_SCOPE,
        vlmtrace.__version__,
        sc.SCHEMA_URL,
    )


def test_a_journal_only_span_gives_the_event_its_ids_and_without_an_sdk_the_event_goes_nowhere():
    recorder = SpanRecorder(None, None)  # no tracer: vlmtrace's own ids
    span = recorder.start("chat m", None, trace.SpanKind.INTERNAL, {sc.GEN_AI_OPERATION_NAME: "chat"})
    recorder.end(span)
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))

    ContentEvents(logger_provider).emit(span, PROMPT, None)
    ContentEvents().emit(span, PROMPT, None)  # the API's no-op logger while no global provider is set

    (emitted,) = logs.get_finished_logs()
    assert (emitted.log_record.trace_id, emitted.log_record.span_id) == (span.trace_id, span.span_id)
    assert sc.GEN_AI_OUTPUT_MESSAGES not in emitted.log_record.attributes
