"""export/sdk_compat.py: each reach into the SDK's private attributes, and its public fallback where the
SDK has changed (simulated: the private attribute is missing or of another shape)."""

from __future__ import annotations

import types

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import vlmtrace
from vlmtrace.export import sdk_compat


def provider_with_memory_exporter() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_where_processors_cannot_be_listed_the_bridge_is_appended_and_flush_still_delivers(monkeypatch):
    monkeypatch.setattr(sdk_compat, "_fan_out_with_list", lambda provider: None)
    provider, exporter = provider_with_memory_exporter()
    session = vlmtrace.instrument(tracer_provider=provider, journal=None, sample_interval_ms=0)
    try:
        assert session.tracing.bridge is not None and not session.tracing.bridge.first
        session.telemetry.start("ended just now", "test", context=Context()).end()
        assert provider.force_flush()  # the bridge, last in line, flushes the others after handing over
        assert [s.name for s in exporter.get_finished_spans()] == ["ended just now"]
    finally:
        vlmtrace.uninstrument()


def test_the_provider_side_fallbacks():
    provider, _ = provider_with_memory_exporter()
    fan_out = sdk_compat.fan_out(provider, "t")
    only_public = types.SimpleNamespace(get_tracer=provider.get_tracer)  # no _active_span_processor
    assert sdk_compat.fan_out(only_public, "t") is fan_out
    assert sdk_compat.span_processors(only_public) is None
    assert isinstance(sdk_compat.span_limits(only_public), SpanLimits)
    assert sdk_compat.update_resource(only_public, Resource({"service.name": "x"})) is False
    assert sdk_compat.update_resource(provider, Resource({"service.name": "x"})) is True
    assert provider.resource.attributes["service.name"] == "x"


def test_the_span_side_fallbacks():
    provider, exporter = provider_with_memory_exporter()
    tracer = provider.get_tracer("t")
    linked = tracer.start_span("linked").get_span_context()
    with tracer.start_as_current_span("s", attributes={"a": 1}, links=[]) as span:
        span.add_link(linked)
        span.add_event("e", {"k": "v"})
    (ended,) = exporter.get_finished_spans()
    public = types.SimpleNamespace(attributes=ended.attributes, links=ended.links, events=ended.events)
    for readable in (ended, public):
        assert dict(sdk_compat.span_attributes(readable)) == {"a": 1}
        assert [link.context.span_id for link in sdk_compat.span_links(readable)] == [linked.span_id]
        assert [event.name for event in sdk_compat.span_events(readable)] == ["e"]
    assert sdk_compat.attribute_mapping(None) == {}
