"""vlmtrace's spans reach a real OTLP collector (rotel on 127.0.0.1) through the SDK that vlmtrace.configure()
installs, over gRPC and HTTP/protobuf, with typed attributes and the journal's ids."""

from __future__ import annotations

import os
import socket

import pytest
from opentelemetry import trace

from tests.export.journal_lines import of_kind, records_of
from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export.configure import configure, installed
from vlmtrace.export.recorded_span import SpanEvent
from vlmtrace.export.recorder import SpanRecorder
from vlmtrace.export.tracing import open_tracing

pytestmark = [pytest.mark.collector, pytest.mark.usefixtures("fresh_global_tracer_provider")]

REQUEST_ATTRIBUTES = {
    semconv.STAGE: semconv.STAGE_REQUEST,
    semconv.GEN_AI_OPERATION_NAME: "chat",
    semconv.GEN_AI_PROVIDER_NAME: semconv.GEN_AI_PROVIDER,
    semconv.GEN_AI_REQUEST_MODEL: "tiny-vl",
    semconv.GEN_AI_REQUEST_MAX_TOKENS: 64,
    semconv.GEN_AI_REQUEST_TEMPERATURE: 0.7,
    semconv.GEN_AI_USAGE_INPUT_TOKENS: 1290,
    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 64,
    semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("length",),
    semconv.LMDEPLOY_BACKEND: "turbomind",
    semconv.REQUEST_TTFT: 0.0125,
}
VISION_ATTRIBUTES = {
    semconv.STAGE: semconv.STAGE_VISION_PREPROCESS,
    semconv.VISION_IMAGES: 2,
    semconv.VISION_IMAGE_WIDTHS: (640, 1024),
    semconv.VISION_IMAGE_HEIGHTS: (480, 768),
    semconv.MEM_DEVICES: (0, 1),
    semconv.MEM_TORCH_ALLOCATED: 6 << 30,
    semconv.MEM_TORCH_ALLOCATED + semconv.DELTA_SUFFIX: -(1 << 20),
    semconv.MEM_GPU_PROCESS + semconv.PER_DEVICE_SUFFIX: (3 << 30, 5 << 30),
    semconv.MEM_HOST_RSS: 2_500_000_000,
}


def emit_request(tracing) -> None:
    """A request span and its vision span, as vlmtrace's wrappers record them."""
    recorder = SpanRecorder(tracing.journal, tracing.tracer)
    request = recorder.start("chat tiny-vl", None, trace.SpanKind.CLIENT, dict(REQUEST_ATTRIBUTES))
    vision = recorder.start(semconv.SPAN_VISION_PREPROCESS, request, trace.SpanKind.INTERNAL, dict(VISION_ATTRIBUTES))
    recorder.end(vision, events=[SpanEvent("vlmtrace.slice", {semconv.VISION_PIXELS: 307200}, vision.start_ns + 1)])
    recorder.end(request)


def expected(attributes):
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attributes.items()}


def assert_received_like_the_journal(collector, journal_dir, service_name):
    received = {span.name: span for span in collector.wait_for_spans(2, timeout=20)}
    request, vision = received["chat tiny-vl"], received[semconv.SPAN_VISION_PREPROCESS]
    assert request.attributes == expected(REQUEST_ATTRIBUTES)
    assert vision.attributes == expected(VISION_ATTRIBUTES)
    assert vision.parent_id == request.span_id and request.parent_id is None
    assert vision.trace_id == request.trace_id
    assert vision.events[0]["name"] == "vlmtrace.slice"
    assert vision.events[0]["attributes"] == {semconv.VISION_PIXELS: 307200}
    assert request.resource["service.name"] == service_name
    assert request.resource["host.name"] == socket.gethostname()
    assert request.resource["process.pid"] == os.getpid()
    assert request.resource[semconv.RESOURCE_VLMTRACE_VERSION] == "0.1.0"
    assert request.resource["service.instance.id"]

    journal_ends = {r["span_id"]: r for r in of_kind(records_of(journal_dir), "end")}
    for span in (request, vision):
        in_journal = journal_ends[span.span_id]
        assert (in_journal["trace_id"], in_journal["name"]) == (span.trace_id, span.name)
        assert (in_journal["start"], in_journal["t"]) == (span.start_ns, span.end_ns)
        assert in_journal["attrs"] == span.attributes


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_arrive_with_typed_attributes_over_each_protocol(otlp_collector, tmp_path, protocol):
    endpoint = otlp_collector.grpc_endpoint if protocol == "grpc" else otlp_collector.http_endpoint
    options = Options.resolve(
        {
            "otlp_endpoint": endpoint,
            "otlp_protocol": protocol,
            "journal": str(tmp_path / "j"),
            "service_name": "vl-svc",
        },
        environ={},
    )
    provider = configure(endpoint, protocol=protocol, service_name="vl-svc", export_metrics=False)
    tracing = open_tracing(options)
    emit_request(tracing)
    provider.shutdown()  # flushes the batch
    tracing.shutdown()

    assert_received_like_the_journal(otlp_collector, tmp_path / "j", "vl-svc")
    assert of_kind(records_of(tmp_path / "j"), "dropped") == []


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_standard_otel_variables_configure_the_export(otlp_collector, tmp_path, monkeypatch, protocol):
    endpoint = otlp_collector.grpc_endpoint if protocol == "grpc" else otlp_collector.http_endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)  # HTTP: a base URL, /v1/traces is appended
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,service.namespace=vl")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    provider = configure(export_metrics=False)
    tracing = open_tracing(Options.resolve({"journal": str(tmp_path / "j")}))
    emit_request(tracing)

    assert_received_like_the_journal(otlp_collector, tmp_path / "j", "from-env")  # exported without a flush
    request = otlp_collector.wait_for_spans(where=lambda span: span.name == "chat tiny-vl")[0]
    assert request.resource["deployment.environment"] == "test"
    assert request.resource["service.namespace"] == "vl"
    tracing.shutdown()
    provider.shutdown()


def test_an_endpoint_that_comes_back_receives_new_spans_and_the_outage_is_counted(
    otlp_collector, tmp_path, monkeypatch
):
    """Spans ended while the collector was unreachable are dropped and counted; export resumes by itself."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
    provider = configure(otlp_collector.http_endpoint, export_metrics=False)
    tracing = open_tracing(Options.resolve({"journal": str(tmp_path / "j")}))
    tracer = trace.get_tracer("vlmtrace-test")
    otlp_collector.stop()
    for i in range(20):
        with tracer.start_as_current_span("during outage", attributes={"i": i}):
            pass
    otlp_collector.start()
    processor = installed().processor
    assert processor.dropped >= 4  # 8 in the batch being retried and 8 queued behind it may still be delivered
    assert provider.force_flush(timeout_millis=15000)  # the exporter's retry reaches the collector
    with tracer.start_as_current_span("after outage"):
        pass
    provider.shutdown()
    tracing.shutdown()

    assert otlp_collector.wait_for_spans(where=lambda span: span.name == "after outage")
    delivered = len([span for span in otlp_collector.spans() if span.name == "during outage"])
    assert delivered + processor.dropped == 20
    assert of_kind(records_of(tmp_path / "j"), "dropped")[-1]["otlp_spans"] == processor.dropped
