"""vlmtrace.configure(): the explicit step that installs an SDK exporting OTLP, for applications without one."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.export.configure import configure
from vlmtrace.export.otlp import BoundedBatchSpanProcessor

pytestmark = pytest.mark.usefixtures("fresh_global_tracer_provider")
REPO = Path(__file__).resolve().parents[2]


def test_it_installs_an_sdk_provider_with_otlp_and_the_resource(refused_endpoint, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=pod-1")
    provider = configure(refused_endpoint, service_name="vl-api", export_metrics=False)
    try:
        assert trace.get_tracer_provider() is provider and isinstance(provider, TracerProvider)
        processors = provider._active_span_processor._span_processors
        assert [type(p) for p in processors] == [BoundedBatchSpanProcessor]
        attributes = provider.resource.attributes
        assert attributes["service.name"] == "vl-api" and attributes["k8s.pod.name"] == "pod-1"
        assert attributes["host.name"] == socket.gethostname()
        assert attributes[sc.RESOURCE_VLMTRACE_VERSION] == vlmtrace.__version__
    finally:
        provider.shutdown()


def test_the_export_queue_size_given_in_the_call_bounds_the_otlp_processor(refused_endpoint):
    provider = configure(refused_endpoint, export_metrics=False, max_queue_size=7)
    try:
        (processor,) = provider._active_span_processor._span_processors
        assert processor._max_queue_size == 7
    finally:
        provider.shutdown()


def test_an_installed_sdk_provider_is_left_as_it_is_with_a_warning(caplog):
    theirs = TracerProvider(shutdown_on_exit=False)
    trace.set_tracer_provider(theirs)
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        assert configure("http://127.0.0.1:9", export_metrics=False) is theirs
    assert "installed already" in caplog.text
    assert theirs._active_span_processor._span_processors == ()


def test_otel_traces_exporter_none_installs_the_provider_without_otlp():
    provider = configure("http://127.0.0.1:9", export_metrics=False)  # the variable is read as it is now
    provider.shutdown()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OTEL_TRACES_EXPORTER", "none")
        patch.setattr(trace, "_TRACER_PROVIDER", None)
        from opentelemetry.util._once import Once

        patch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
        quiet = configure("http://127.0.0.1:9", export_metrics=False)
    assert quiet._active_span_processor._span_processors == ()


def test_without_the_sdk_it_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if the SDK were not installed
    with pytest.raises(ImportError, match=r"pip install 'vlmtrace\[otlp\]'"):
        configure("http://127.0.0.1:9")
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


SHUTS_DOWN_ITS_PROVIDERS = """
import sys
import vlmtrace
from opentelemetry import metrics, trace
vlmtrace.configure(sys.argv[1])
trace.get_tracer_provider().shutdown()  # an application's own exit path, before the exit hooks
metrics.get_meter_provider().shutdown(timeout_millis=200)
"""


def test_providers_the_application_shut_down_itself_are_left_quiet_at_exit(refused_endpoint):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLMTRACE_"))},
        "PYTHONPATH": str(REPO / "src"),
    }
    done = subprocess.run(
        [sys.executable, "-c", SHUTS_DOWN_ITS_PROVIDERS, refused_endpoint],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "shutdown can only be called once" not in done.stderr
    assert "Processor is already shutdown" not in done.stderr


PROGRAM = """
import lmdeploy  # vlmtrace run's bootstrap configures and instruments this process here
from opentelemetry import trace
from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor
LMDeployInstrumentor.session.telemetry.start("lmdeploy.vision.preprocess", "vision.preprocess").end()
print(type(trace.get_tracer_provider()).__module__)
"""


@pytest.mark.collector
@pytest.mark.lmdeploy
def test_vlmtrace_run_with_an_otlp_endpoint_exports_each_process_through_its_own_sdk(otlp_collector, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLMTRACE_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]), VLMTRACE_SAMPLE_INTERVAL_MS="0")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlmtrace",
            "run",
            "--journal",
            "j",
            "--service-name",
            "run-otlp",
            "--otlp-endpoint",
            otlp_collector.http_endpoint,
            "--",
            sys.executable,
            "-c",
            PROGRAM,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "opentelemetry.sdk.trace"
    (span,) = otlp_collector.wait_for_spans(where=lambda s: s.name == "lmdeploy.vision.preprocess")
    assert span.resource["service.name"] == "run-otlp"
    journaled = [
        json.loads(line)
        for path in (tmp_path / "j").glob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.startswith("{")
    ]
    assert span.span_id in {r.get("span_id") for r in journaled}


@pytest.mark.collector
@pytest.mark.usefixtures("fresh_global_meter_provider")
def test_an_endpoint_given_to_instrument_configures_the_export_and_uninstrument_sends_every_span(
    otlp_collector, tmp_path
):
    session = vlmtrace.instrument(
        otlp_endpoint=otlp_collector.http_endpoint,
        service_name="given-endpoint",
        journal=str(tmp_path / "j"),
        sample_interval_ms=0,
    )
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    span = session.telemetry.start("lmdeploy.vision.preprocess", "vision.preprocess")
    span.end()
    vlmtrace.uninstrument()  # flushes what configure() installed

    received = otlp_collector.spans()
    assert [s.name for s in received] == ["lmdeploy.vision.preprocess"]
    assert received[0].resource["service.name"] == "given-endpoint"
    assert received[0].span_id == f"{span.span_context.span_id:016x}"


def test_on_the_configured_provider_other_instrumentations_spans_are_journaled_once_beside_vlmtraces(
    tmp_path, refused_endpoint
):
    from opentelemetry.trace import SpanKind

    from tests.export.journal_lines import of_kind, records_of
    from vlmtrace.config import Options
    from vlmtrace.export.recorder import SpanRecorder
    from vlmtrace.export.tracing import open_tracing

    provider = configure(refused_endpoint, export_metrics=False)
    tracing = open_tracing(Options.resolve({"journal": str(tmp_path / "j"), "shutdown_timeout_ms": 200}))
    recorder = SpanRecorder(tracing.journal, tracing.tracer)
    with trace.get_tracer("fastapi").start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER):
        recorder.end(recorder.start("chat tiny-vl", None, SpanKind.INTERNAL, {}))
    tracing.shutdown()
    provider.shutdown()

    records = records_of(tmp_path / "j")
    ends = {r["name"]: r for r in of_kind(records, "end")}
    assert (
        sorted(r["name"] for r in of_kind(records, "start"))
        == sorted(ends)
        == ["POST /v1/chat/completions", "chat tiny-vl"]
    )
    assert ends["chat tiny-vl"]["parent_id"] == ends["POST /v1/chat/completions"]["span_id"]
