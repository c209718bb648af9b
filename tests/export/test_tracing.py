"""configure_tracing: whose provider gets which processors, the Resource, endpoint rules, and shutdown."""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.export.journal_lines import of_kind, records_of
from vlmtrace.config import Options
from vlmtrace.export import sdk_compat
from vlmtrace.export.journal import JournalSpanProcessor
from vlmtrace.export.otlp import BoundedBatchSpanProcessor, otlp_span_processor, otlp_wanted, traces_endpoint
from vlmtrace.export.tracing import configure_tracing

pytestmark = pytest.mark.usefixtures("fresh_global_tracer_provider")


def resolve(environ=None, **overrides) -> Options:
    return Options.resolve(overrides, environ={} if environ is None else environ)


def kinds(tracing):
    return [type(p) for p in tracing.processors]


def test_without_an_endpoint_only_the_journal_is_attached_to_a_new_global_provider(tmp_path):
    tracing = configure_tracing(resolve(journal=str(tmp_path / "j")))

    assert trace.get_tracer_provider() is tracing.provider
    assert kinds(tracing) == [JournalSpanProcessor]
    with trace.get_tracer("t").start_as_current_span("work"):
        pass
    tracing.shutdown()
    assert [r["name"] for r in of_kind(records_of(tmp_path / "j"), "end")] == ["work"]


def test_the_new_provider_resource_names_service_instance_host_and_process(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored,k8s.pod.name=pod-1,lmdeploy.version=env")
    tracing = configure_tracing(
        resolve(journal=str(tmp_path / "j"), service_name="vl-api"),
        resource_attributes={"lmdeploy.version": "0.18.0"},
        versions={"lmdeploy": "0.18.0", "torch": None},
    )
    tracing.shutdown()

    attributes = dict(tracing.provider.resource.attributes)
    assert attributes["service.name"] == "vl-api"
    assert attributes["host.name"] == socket.gethostname()
    assert attributes["process.pid"] == os.getpid()
    assert attributes["k8s.pod.name"] == "pod-1"
    assert attributes["lmdeploy.version"] == "0.18.0"  # the caller's attributes win over the environment's
    assert len(attributes["service.instance.id"]) == 36
    header = records_of(tmp_path / "j")[0]
    assert header["resource"] == attributes
    assert header["versions"]["lmdeploy"] == "0.18.0" and "torch" not in header["versions"]


def test_the_default_service_name_yields_to_otel_resource_attributes(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource-attributes")
    tracing = configure_tracing(resolve(journal=None))
    tracing.shutdown()
    assert tracing.provider.resource.attributes["service.name"] == "from-resource-attributes"


def test_a_provider_the_application_installed_gets_the_journal_only_and_is_left_as_found(tmp_path, refused_endpoint):
    theirs = TracerProvider(shutdown_on_exit=False)
    their_spans = InMemorySpanExporter()
    theirs.add_span_processor(SimpleSpanProcessor(their_spans))
    trace.set_tracer_provider(theirs)  # as opentelemetry-instrument would

    tracing = configure_tracing(resolve(journal=str(tmp_path / "j"), otlp_endpoint=refused_endpoint))
    assert tracing.provider is theirs
    assert kinds(tracing) == [JournalSpanProcessor]  # their exporters are theirs to configure
    tracer = trace.get_tracer("t")
    with tracer.start_as_current_span("while instrumented"):
        pass
    tracing.shutdown()
    with tracer.start_as_current_span("after shutdown"):
        pass

    assert [s.name for s in their_spans.get_finished_spans()] == ["while instrumented", "after shutdown"]
    assert tracing.processors[0] not in sdk_compat.span_processors(theirs)
    records = records_of(tmp_path / "j")
    assert [r["name"] for r in of_kind(records, "end")] == ["while instrumented"]
    assert records[-1]["k"] == "end_marker"


def test_an_explicit_provider_is_used_even_when_another_is_global(tmp_path):
    global_provider = TracerProvider(shutdown_on_exit=False)
    trace.set_tracer_provider(global_provider)
    mine = TracerProvider(shutdown_on_exit=False)

    tracing = configure_tracing(resolve(journal=str(tmp_path / "j")), tracer_provider=mine)
    with mine.get_tracer("t").start_as_current_span("on mine"):
        pass
    with global_provider.get_tracer("t").start_as_current_span("on global"):
        pass
    tracing.shutdown()

    assert tracing.provider is mine
    assert [r["name"] for r in of_kind(records_of(tmp_path / "j"), "end")] == ["on mine"]


def test_configuring_again_after_shutdown_reuses_our_global_provider_with_otlp(tmp_path, refused_endpoint):
    options = resolve(journal=str(tmp_path / "j"), otlp_endpoint=refused_endpoint, shutdown_timeout_ms=200)
    first = configure_tracing(options)
    first.shutdown()
    second = configure_tracing(options)
    second.shutdown()

    assert second.provider is first.provider
    assert kinds(second) == [JournalSpanProcessor, BoundedBatchSpanProcessor]
    assert sdk_compat.span_processors(first.provider) == ()


def test_instrumenting_again_with_another_service_name_renames_our_provider(tmp_path, refused_endpoint):
    first = configure_tracing(resolve(journal=None))
    held = trace.get_tracer("held by other code")
    first.shutdown()
    second = configure_tracing(resolve(journal=str(tmp_path / "j"), service_name="second",
                                       otlp_endpoint=refused_endpoint, shutdown_timeout_ms=200))
    second.shutdown()

    assert second.provider is first.provider is trace.get_tracer_provider()
    assert second.provider.resource.attributes["service.name"] == "second"
    assert held.resource.attributes["service.name"] == "second"
    assert records_of(tmp_path / "j")[0]["resource"]["service.name"] == "second"


def test_otel_sdk_disabled_gives_a_no_op_tracing(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tracing = configure_tracing(resolve(journal=str(tmp_path / "j"), otlp_endpoint="127.0.0.1:4317"))

    assert tracing.journal is None and tracing.processors == ()
    assert trace.get_tracer_provider() is not tracing.provider
    assert not tracing.provider.get_tracer("t").start_span("x").is_recording()
    assert not (tmp_path / "j").exists()
    tracing.shutdown()


def test_an_unwritable_journal_gives_one_warning_and_tracing_continues(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        tracing = configure_tracing(resolve(journal=str(blocker / "journal")))
        with trace.get_tracer("t").start_as_current_span("still traced") as span:
            assert span.is_recording()
        tracing.shutdown()

    assert tracing.journal is None
    assert len([r for r in caplog.records if r.name == "vlmtrace"]) == 1


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_shutdown_is_bounded_when_the_endpoint_hangs_and_is_idempotent(tmp_path, blackhole_endpoint, protocol):
    tracing = configure_tracing(
        resolve(journal=str(tmp_path / "j"), otlp_endpoint=blackhole_endpoint, otlp_protocol=protocol)
    )  # the default shutdown timeout: 2 s
    tracer = trace.get_tracer("t")
    for _ in range(600):  # more than one export batch
        with tracer.start_as_current_span("s"):
            pass
    assert tracing.provider.force_flush(timeout_millis=300) is False  # a hung endpoint: the flush gives up in time

    started = time.monotonic()
    tracing.shutdown()
    tracing.shutdown()
    elapsed = time.monotonic() - started

    assert elapsed < 2.0 + 1.5
    records = records_of(tmp_path / "j")
    assert [r["k"] for r in records[-2:]] == ["dropped", "end_marker"]
    assert records[-2]["otlp_spans"] == 600


def test_otlp_is_on_for_an_endpoint_or_otel_traces_exporter_otlp_and_off_for_none():
    assert not otlp_wanted(resolve(), environ={})
    assert otlp_wanted(resolve(otlp_endpoint="collector:4318"), environ={})
    assert otlp_wanted(resolve(), environ={"OTEL_TRACES_EXPORTER": "console,otlp"})
    assert not otlp_wanted(resolve(otlp_endpoint="collector:4318"), environ={"OTEL_TRACES_EXPORTER": "none"})
    assert otlp_span_processor(resolve(), None) is None


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
        configure_tracing(resolve()).shutdown()  # the default: ./vlmtrace-journal
        configure_tracing(resolve(journal=str(tmp_path / "chosen"))).shutdown()

    default, chosen = [r for r in caplog.records if "journaling every span" in r.getMessage()]
    assert default.levelno == logging.WARNING and str(tmp_path / "vlmtrace-journal") in default.getMessage()
    assert chosen.levelno == logging.INFO and str(tmp_path / "chosen") in chosen.getMessage()
