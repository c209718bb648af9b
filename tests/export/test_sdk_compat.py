"""export/sdk_compat.py: each reach into the SDK's private attributes, and its public fallback where the
SDK has changed (simulated: the private attribute is missing or of another shape)."""

from __future__ import annotations

import types

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from vlmtrace.export import sdk_compat


def provider_with_memory_exporter() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


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


def test_a_meter_provider_its_owner_shut_down_is_known_as_such():
    from opentelemetry.sdk.metrics import MeterProvider

    provider = MeterProvider(shutdown_on_exit=False)
    assert not sdk_compat.meter_provider_shut_down(provider)
    provider.shutdown()
    assert sdk_compat.meter_provider_shut_down(provider)
    assert not sdk_compat.meter_provider_shut_down(types.SimpleNamespace())  # no such attribute: shut down again
