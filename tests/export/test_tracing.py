"""open_tracing: vlmtrace's tracer through the API (no provider installed, one installed later used), the
journal's Resource with and without an SDK, and the OTLP endpoint rules vlmtrace.configure() follows."""

from __future__ import annotations

import logging
import os
import socket

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import vlmtrace
from tests.export.journal_lines import of_kind, records_of
from vlmtrace import semconv as sc
from vlmtrace.config import Options
from vlmtrace.export.otlp import traces_endpoint
from vlmtrace.export.recorder import SpanRecorder
from vlmtrace.export.tracing import open_tracing

pytestmark = pytest.mark.usefixtures("fresh_global_tracer_provider")


def resolve(environ=None, **overrides) -> Options:
    return Options.resolve(overrides, environ={} if environ is None else environ)


def provider_into_memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(shutdown_on_exit=False, resource=Resource({"service.name": "theirs"}))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_no_provider_is_installed_and_one_installed_later_receives_the_spans(tmp_path):
    tracing = open_tracing(resolve(journal=str(tmp_path / "j")))
    recorder = SpanRecorder(tracing.journal, tracing.tracer)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert recorder.exporting_tracer() is None  # the API's no-op: journal only
    recorder.end(recorder.start("before", None, trace.SpanKind.INTERNAL, {}))

    provider, exporter = provider_into_memory()
    trace.set_tracer_provider(provider)
    recorder.end(recorder.start("after", None, trace.SpanKind.INTERNAL, {}))
    tracing.shutdown()

    (exported,) = exporter.get_finished_spans()
    assert exported.name == "after"
    scope = exported.instrumentation_scope
    assert (scope.name, scope.version, scope.schema_url) == (
        sc.INSTRUMENTATION_SCOPE,
        vlmtrace.__version__,
        sc.SCHEMA_URL,
    )
    ended = of_kind(records_of(tmp_path / "j"), "end")
    assert [r["name"] for r in ended] == ["before", "after"]
    assert ended[1]["span_id"] == f"{exported.context.span_id:016x}"
    assert provider.resource.attributes["service.name"] == "theirs"  # left as found


def test_without_an_sdk_the_journal_names_service_instance_host_and_process(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored,k8s.pod.name=pod%2D1,lmdeploy.version=env")
    tracing = open_tracing(
        resolve(journal=str(tmp_path / "j"), service_name="vl-api"),
        resource_attributes={"lmdeploy.version": "0.18.0"},
        versions={"lmdeploy": "0.18.0", "torch": None},
    )
    tracing.shutdown()

    header = records_of(tmp_path / "j")[0]
    attributes = header["resource"]
    assert attributes["service.name"] == "vl-api"
    assert attributes["host.name"] == socket.gethostname()
    assert attributes["process.pid"] == os.getpid()
    assert attributes["k8s.pod.name"] == "pod-1"
    assert len(attributes["service.instance.id"]) == 36
    assert header["versions"]["lmdeploy"] == "0.18.0" and "torch" not in header["versions"]


def test_the_default_service_name_yields_to_otel_resource_attributes(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource-attributes")
    open_tracing(resolve(journal=str(tmp_path / "j"))).shutdown()
    assert records_of(tmp_path / "j")[0]["resource"]["service.name"] == "from-resource-attributes"


def test_an_installed_provider_names_the_journal_and_is_left_as_found(tmp_path):
    provider, exporter = provider_into_memory()
    processors = provider._active_span_processor._span_processors
    trace.set_tracer_provider(provider)  # as opentelemetry-instrument would

    tracing = open_tracing(resolve(journal=str(tmp_path / "j")), resource_attributes={"lmdeploy.version": "0.18.0"})
    with trace.get_tracer("theirs").start_as_current_span("their span"):
        pass
    tracing.shutdown()

    assert provider._active_span_processor._span_processors == processors
    assert [s.name for s in exporter.get_finished_spans()] == ["their span"]
    header = records_of(tmp_path / "j")[0]
    assert header["resource"]["service.name"] == "theirs"
    assert header["resource"]["lmdeploy.version"] == "0.18.0"


def test_the_api_global_the_recorder_reads_at_each_span_holds_the_provider_once_one_is_set(tmp_path):
    """SpanRecorder.start tells whether a global provider is set by reading the API's module global (the one
    private read of the API, on the hot path); this is what it relies on, checked on the newest API too."""
    import opentelemetry.trace as trace_api

    tracing = open_tracing(resolve(journal=None))
    recorder = SpanRecorder(tracing.journal, tracing.tracer)
    assert type(tracing.tracer) is trace.ProxyTracer
    assert trace_api._TRACER_PROVIDER is None
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert recorder.exporting_tracer() is None

    provider, exporter = provider_into_memory()
    trace.set_tracer_provider(provider)
    assert trace_api._TRACER_PROVIDER is provider is trace.get_tracer_provider()
    tracer = recorder.exporting_tracer()
    assert tracer is recorder.exporting_tracer()  # resolved once, through the public API, then used directly
    recorder.end(recorder.start("recorded", None, trace.SpanKind.INTERNAL, {}))
    tracing.shutdown()
    (recorded,) = exporter.get_finished_spans()
    scope = recorded.instrumentation_scope
    assert (recorded.name, scope.name, scope.version, scope.schema_url) == (
        "recorded",
        sc.INSTRUMENTATION_SCOPE,
        vlmtrace.__version__,
        sc.SCHEMA_URL,
    )


def test_an_explicit_provider_is_used_even_when_another_is_global(tmp_path):
    global_provider, global_spans = provider_into_memory()
    trace.set_tracer_provider(global_provider)
    mine, my_spans = provider_into_memory()

    tracing = open_tracing(resolve(journal=None), tracer_provider=mine)
    recorder = SpanRecorder(tracing.journal, tracing.tracer)
    recorder.end(recorder.start("ours", None, trace.SpanKind.INTERNAL, {}))
    tracing.shutdown()

    assert [s.name for s in my_spans.get_finished_spans()] == ["ours"]
    assert global_spans.get_finished_spans() == ()
    assert tracing.provider() is mine


def test_otel_sdk_disabled_leaves_the_journal_and_exports_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    provider, exporter = provider_into_memory()
    tracing = open_tracing(resolve(journal=str(tmp_path / "j")), tracer_provider=provider)
    recorder = SpanRecorder(tracing.journal, tracing.tracer)
    recorder.end(recorder.start("journaled", None, trace.SpanKind.INTERNAL, {}))
    tracing.shutdown()

    assert recorder.exporting_tracer() is None and exporter.get_finished_spans() == ()
    assert [r["name"] for r in of_kind(records_of(tmp_path / "j"), "end")] == ["journaled"]


def test_an_unwritable_journal_gives_one_warning_and_tracing_continues(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    provider, exporter = provider_into_memory()
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        tracing = open_tracing(resolve(journal=str(blocker / "journal")), tracer_provider=provider)
        recorder = SpanRecorder(tracing.journal, tracing.tracer)
        recorder.end(recorder.start("still traced", None, trace.SpanKind.INTERNAL, {}))
        tracing.shutdown()

    assert tracing.journal is None
    assert [s.name for s in exporter.get_finished_spans()] == ["still traced"]
    assert len([r for r in caplog.records if r.name.startswith("vlmtrace.export.journal")]) == 1


def test_shutdown_writes_the_journals_end_once(tmp_path):
    tracing = open_tracing(resolve(journal=str(tmp_path / "j")))
    tracing.shutdown()
    tracing.shutdown()
    assert [r["clean"] for r in of_kind(records_of(tmp_path / "j"), "end_marker")] == [True]


def test_traces_endpoint_follows_the_otlp_specification():
    http = "http/protobuf"
    assert traces_endpoint(resolve(), environ={}) is None  # the exporter's own default
    assert traces_endpoint(resolve(otlp_endpoint="collector:4317", otlp_protocol="grpc"), {}) == "http://collector:4317"
    assert traces_endpoint(resolve(otlp_endpoint="https://c:4317", otlp_protocol="grpc"), {}) == "https://c:4317"
    assert traces_endpoint(resolve(otlp_endpoint="c:4318", otlp_protocol=http), {}) == "http://c:4318/v1/traces"
    assert traces_endpoint(resolve(otlp_endpoint="http://c:4318/", otlp_protocol=http), {}) == "http://c:4318/v1/traces"
    assert traces_endpoint(resolve(otlp_endpoint="http://c/custom", otlp_protocol=http), {}) == "http://c/custom"
    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):  # the exporter reads them
        environ = {variable: "http://c:4318/prefix"}
        assert traces_endpoint(resolve(environ, otlp_protocol=http), environ) is None


def test_the_journal_is_announced_with_a_warning_where_nobody_chose_its_place(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="vlmtrace"):
        open_tracing(resolve()).shutdown()  # the default: ./vlmtrace-journal
        open_tracing(resolve(journal=str(tmp_path / "chosen"))).shutdown()

    default, chosen = [r for r in caplog.records if "journaling every span" in r.getMessage()]
    assert default.levelno == logging.WARNING and str(tmp_path / "vlmtrace-journal") in default.getMessage()
    assert chosen.levelno == logging.INFO and str(tmp_path / "chosen") in chosen.getMessage()
