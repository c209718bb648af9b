"""What a user of the OpenTelemetry SDK relies on holds for vlmtrace's spans: they are the SDK's own spans
(processors see on_start and on_end; inside a wrapped stage the current span is vlmtrace's, recording),
a provider the application installs after instrument() receives them, flush and shutdown deliver them,
the sampler decides what is exported, suppress_instrumentation() stops them, span limits apply. With no
SDK at all, vlmtrace installs no provider and the journal holds every span.

Each test brings its own TracerProvider with the SDK's in-memory exporter, as an application would,
and checks the exported spans against the journal, which records every span whatever the sampler says.
"""

from __future__ import annotations

import pytest
from lmdeploy import GenerationConfig
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler

import vlmtrace
from tests.export.journal_lines import of_kind, records_of
from tests.instrumentation.conftest import image
from vlmtrace import semconv as sc

GEN = GenerationConfig(max_new_tokens=4, top_k=1)


def instrumented(
    tmp_path, global_provider: bool = False, **provider_settings
) -> tuple[TracerProvider, InMemorySpanExporter]:
    """`global_provider`: installed as the global one (as opentelemetry-instrument does), not passed in."""
    provider = TracerProvider(shutdown_on_exit=False, **provider_settings)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if global_provider:
        trace.set_tracer_provider(provider)
    vlmtrace.instrument(
        tracer_provider=None if global_provider else provider, journal=str(tmp_path / "j"), sample_interval_ms=0
    )
    return provider, exporter


def prompt_with_image(cpu_pipeline) -> None:
    cpu_pipeline([("describe this image", image(96, 80))], gen_config=GEN)


def journaled_span_ids(tmp_path) -> set[str]:
    return {r["span_id"] for r in of_kind(records_of(tmp_path / "j"), "end")}


def exported_span_ids(exporter) -> set[str]:
    return {f"{s.context.span_id:016x}" for s in exporter.get_finished_spans()}


@pytest.fixture
def uninstrument_after():
    yield
    vlmtrace.uninstrument()


@pytest.mark.usefixtures("fresh_global_tracer_provider", "uninstrument_after")
@pytest.mark.parametrize("global_provider", [False, True], ids=["passed in", "global"])
def test_force_flush_right_after_the_call_delivers_every_ended_span(tmp_path, cpu_pipeline, global_provider):
    provider, exporter = instrumented(tmp_path, global_provider)
    prompt_with_image(cpu_pipeline)

    assert provider.force_flush()

    names = {s.name for s in exporter.get_finished_spans()}
    assert {sc.SPAN_VISION_PREPROCESS, sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl"} <= names
    vlmtrace.uninstrument()
    assert exported_span_ids(exporter) == journaled_span_ids(tmp_path)


@pytest.mark.usefixtures("fresh_global_tracer_provider", "uninstrument_after")
@pytest.mark.parametrize("global_provider", [False, True], ids=["passed in", "global"])
def test_the_providers_shutdown_delivers_every_ended_span(tmp_path, cpu_pipeline, global_provider):
    provider, exporter = instrumented(tmp_path, global_provider)
    prompt_with_image(cpu_pipeline)

    provider.shutdown()

    vlmtrace.uninstrument()
    exported = exported_span_ids(exporter)
    assert exported and exported == journaled_span_ids(tmp_path)


@pytest.mark.usefixtures("uninstrument_after")
def test_the_providers_sampler_decides_what_is_exported_and_the_journal_records_every_span(tmp_path, cpu_pipeline):
    provider, exporter = instrumented(tmp_path, sampler=ALWAYS_OFF)
    prompt_with_image(cpu_pipeline)

    assert provider.force_flush()
    vlmtrace.uninstrument()  # hands over whatever is left
    assert exporter.get_finished_spans() == ()
    journaled = {r["name"] for r in of_kind(records_of(tmp_path / "j"), "end")}
    assert {sc.SPAN_VISION_PREPROCESS, sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl"} <= journaled


class AskedSampler(Sampler):
    """Samples nothing but the spans named in `exported`, and keeps every name it was asked about. Not
    parent-based: the SDK would ask it about every span, children included."""

    def __init__(self, exported: set[str]) -> None:
        self.exported = exported
        self.asked: list[str] = []

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        self.asked.append(name)
        return (ALWAYS_ON if name in self.exported else ALWAYS_OFF).should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return "AskedSampler"


@pytest.mark.usefixtures("uninstrument_after")
@pytest.mark.parametrize("root_exported", [True, False], ids=["root sampled", "root dropped"])
def test_the_sampler_decides_once_per_trace_and_vlmtraces_spans_inside_it_follow(tmp_path, cpu_pipeline, root_exported):
    """Under the SDK's parent-based sampler, whether a span of ours starts under one of ours given as a span or
    found in the current context (the vision spans under the request's, the request's under the pipeline
    call's, across threads), it follows its parent: the root sampler is asked about the root only."""
    sampler = AskedSampler({sc.SPAN_PIPELINE_INFER} if root_exported else set())
    provider, exporter = instrumented(tmp_path, sampler=ParentBased(sampler))
    prompt_with_image(cpu_pipeline)

    assert provider.force_flush()
    vlmtrace.uninstrument()
    assert sampler.asked == [sc.SPAN_PIPELINE_INFER]
    journaled = journaled_span_ids(tmp_path)
    assert len(journaled) >= 4
    assert exported_span_ids(exporter) == (journaled if root_exported else set())


@pytest.mark.usefixtures("uninstrument_after")
def test_suppress_instrumentation_stops_vlmtraces_spans(tmp_path, cpu_pipeline):
    _, exporter = instrumented(tmp_path)
    with suppress_instrumentation():
        prompt_with_image(cpu_pipeline)
    prompt_with_image(cpu_pipeline)  # only inside the block
    vlmtrace.uninstrument()

    exported = [s.name for s in exporter.get_finished_spans()]
    assert exported.count(sc.SPAN_PIPELINE_INFER) == 1 and exported.count(sc.SPAN_VISION_PREPROCESS) == 1
    assert exported_span_ids(exporter) == journaled_span_ids(tmp_path)


@pytest.mark.usefixtures("uninstrument_after")
def test_span_limits_apply_to_exported_spans_and_the_journal_keeps_every_attribute(tmp_path, cpu_pipeline):
    limits = SpanLimits(max_span_attributes=4, max_span_attribute_length=5)
    provider, exporter = instrumented(tmp_path, span_limits=limits)
    prompt_with_image(cpu_pipeline)
    assert provider.force_flush()

    (request,) = [s for s in exporter.get_finished_spans() if s.name == "chat tiny-qwen2vl"]
    assert len(request.attributes) == 4 and request.dropped_attributes > 0
    assert all(len(v) <= 5 for v in request.attributes.values() if isinstance(v, str))
    vlmtrace.uninstrument()
    (journaled,) = [r for r in of_kind(records_of(tmp_path / "j"), "end") if r["name"] == "chat tiny-qwen2vl"]
    assert journaled["attrs"][sc.GEN_AI_REQUEST_MODEL] == "tiny-qwen2vl"  # longer than 5: kept whole
    assert len(journaled["attrs"]) > 4


@pytest.mark.usefixtures("uninstrument_after")
def test_unlimited_span_limits_export_every_attribute(tmp_path):
    unlimited = SpanLimits(max_span_attributes=SpanLimits.UNSET, max_attributes=SpanLimits.UNSET)
    provider, exporter = instrumented(tmp_path, span_limits=unlimited)
    attributes = {f"vlmtrace.test.{i}": i for i in range(200)}  # more than the default limit, 128
    vlmtrace.instrument().telemetry.start("many attributes", "test", attributes).end()
    assert provider.force_flush()

    (span,) = exporter.get_finished_spans()
    assert {k: v for k, v in span.attributes.items() if k.startswith("vlmtrace.test.")} == attributes


class TenantAtStart(SpanProcessor):
    """Sets an attribute on every span as it starts, as a tenant or baggage-to-attribute processor does."""

    def on_start(self, span, parent_context=None) -> None:
        span.set_attribute("app.tenant", "blue")


@pytest.mark.usefixtures("fresh_global_tracer_provider", "uninstrument_after")
def test_an_sdk_the_application_installs_after_instrument_receives_every_span_as_its_own(
    tmp_path, cpu_pipeline, monkeypatch
):
    from lmdeploy.vl.model.qwen2 import Qwen2VLModel

    vlmtrace.instrument(journal=str(tmp_path / "j"), sample_interval_ms=0)
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(TenantAtStart())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider  # vlmtrace took no global provider before it

    preprocess = Qwen2VLModel.preprocess

    def preprocess_noting_the_current_span(self, *args, **kwargs):  # the application's code inside the stage
        current = trace.get_current_span()
        current.set_attribute("app.image.checked", True)
        current.add_event("app.image.seen")
        return preprocess(self, *args, **kwargs)

    monkeypatch.setattr(Qwen2VLModel, "preprocess", preprocess_noting_the_current_span)
    with provider.get_tracer("app").start_as_current_span("app.handle"):
        prompt_with_image(cpu_pipeline)
    vlmtrace.uninstrument()

    spans = exporter.get_finished_spans()
    ours = [s for s in spans if s.instrumentation_scope.name == sc.INSTRUMENTATION_SCOPE]
    assert {sc.SPAN_VISION_PREPROCESS, sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl"} <= {s.name for s in ours}
    assert all(s.attributes.get("app.tenant") == "blue" for s in spans)
    assert ours[0].instrumentation_scope.schema_url == sc.SCHEMA_URL
    (app,) = [s for s in spans if s.name == "app.handle"]
    (infer,) = [s for s in ours if s.name == sc.SPAN_PIPELINE_INFER]
    assert infer.parent.span_id == app.context.span_id
    (vision,) = [s for s in ours if s.name == sc.SPAN_VISION_PREPROCESS]
    assert vision.attributes["app.image.checked"] is True
    assert [e.name for e in vision.events] == ["app.image.seen"]
    assert {f"{s.context.span_id:016x}" for s in ours} == journaled_span_ids(tmp_path)


@pytest.mark.usefixtures("fresh_global_tracer_provider", "uninstrument_after")
def test_without_an_sdk_vlmtrace_installs_no_provider_and_journals_every_span(tmp_path, cpu_pipeline):
    vlmtrace.instrument(journal=str(tmp_path / "j"), sample_interval_ms=0)
    prompt_with_image(cpu_pipeline)
    vlmtrace.uninstrument()

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    records = records_of(tmp_path / "j")
    started = {r["span_id"] for r in of_kind(records, "start")}
    ended = {r["name"]: r for r in of_kind(records, "end")}
    assert {sc.SPAN_VISION_PREPROCESS, sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl"} <= set(ended)
    assert started == {r["span_id"] for r in of_kind(records, "end")}
    assert [r["clean"] for r in of_kind(records, "end_marker")] == [True]
