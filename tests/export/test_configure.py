"""vlmtrace.configure(): the explicit step that installs an SDK exporting OTLP, for applications without one."""

from __future__ import annotations

import logging
import socket
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.export.configure import configure
from vlmtrace.export.otlp import BoundedBatchSpanProcessor

pytestmark = pytest.mark.usefixtures("fresh_global_tracer_provider")


def test_it_installs_an_sdk_provider_with_otlp_and_the_resource(refused_endpoint, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=pod-1")
    provider = configure(refused_endpoint, service_name="vl-api", export_metrics=False)
    try:
        assert trace.get_tracer_provider() is provider and isinstance(provider, TracerProvider)
        processors = provider._active_span_processor._span_processors  # noqa: SLF001 - what it installed
        assert [type(p) for p in processors] == [BoundedBatchSpanProcessor]
        attributes = provider.resource.attributes
        assert attributes["service.name"] == "vl-api" and attributes["k8s.pod.name"] == "pod-1"
        assert attributes["host.name"] == socket.gethostname()
        assert attributes[sc.RESOURCE_VLMTRACE_VERSION] == vlmtrace.__version__
    finally:
        provider.shutdown()


def test_an_installed_sdk_provider_is_left_as_it_is_with_a_warning(caplog):
    theirs = TracerProvider(shutdown_on_exit=False)
    trace.set_tracer_provider(theirs)
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        assert configure("http://127.0.0.1:9", export_metrics=False) is theirs
    assert "installed already" in caplog.text
    assert theirs._active_span_processor._span_processors == ()  # noqa: SLF001


def test_otel_traces_exporter_none_installs_the_provider_without_otlp():
    provider = configure("http://127.0.0.1:9", export_metrics=False)  # the variable is read as it is now
    provider.shutdown()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OTEL_TRACES_EXPORTER", "none")
        patch.setattr(trace, "_TRACER_PROVIDER", None)
        from opentelemetry.util._once import Once

        patch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
        quiet = configure("http://127.0.0.1:9", export_metrics=False)
    assert quiet._active_span_processor._span_processors == ()  # noqa: SLF001


def test_without_the_sdk_it_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if the SDK were not installed
    with pytest.raises(ImportError, match=r"pip install 'vlmtrace\[otlp\]'"):
        configure("http://127.0.0.1:9")
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
