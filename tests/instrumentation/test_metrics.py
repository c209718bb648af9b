"""Metrics from LMDeploy 0.18's real pipeline on the CPU, read back through an in-memory metric reader."""

from __future__ import annotations

import pytest
from lmdeploy import GenerationConfig
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import vlmtrace
from tests.instrumentation.conftest import image, spans_by_name
from tests.support import fake_gpu
from vlmtrace import semconv as sc
from vlmtrace.instrumentation import metrics as vt_metrics

GEN = GenerationConfig(max_new_tokens=6, top_k=1)


def collected(reader) -> dict[str, list]:
    """{metric name: [(attributes, point), ...]} of one collection."""
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    found.setdefault(metric.name, []).append((dict(point.attributes), point))
    return found


@pytest.fixture
def metered(exporter):
    """vlmtrace with an in-memory span exporter and an in-memory metric reader; sampler off."""
    reader = InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    session = vlmtrace.instrument(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        journal=None,
        sample_interval_ms=0,
    )
    yield session, reader
    vlmtrace.uninstrument()


def test_finished_requests_feed_the_genai_histograms_and_the_counters(metered, exporter, cpu_pipeline):
    _session, reader = metered
    cpu_pipeline(
        [("describe this image", image(64, 64)), ("compare", [image(32, 32, 1), image(48, 40, 2)])], gen_config=GEN
    )
    requests = spans_by_name(exporter)["chat tiny-qwen2vl"]
    points = collected(reader)

    model = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "lmdeploy",
        sc.GEN_AI_REQUEST_MODEL: "tiny-qwen2vl",
    }
    (durations,) = points[sc.METRIC_REQUEST_DURATION]
    assert durations[0] == model
    assert durations[1].count == 2
    spans_seconds = sum((r.end_time - r.start_time) / 1e9 for r in requests)
    assert durations[1].sum == pytest.approx(spans_seconds, rel=0.2, abs=0.005)
    assert list(durations[1].explicit_bounds) == list(vt_metrics.REQUEST_DURATION_BUCKETS)
    (ttft,) = points[sc.METRIC_TIME_TO_FIRST_TOKEN]
    assert ttft[1].count == 2
    assert ttft[1].sum == pytest.approx(sum(r.attributes[sc.REQUEST_TTFT] for r in requests), rel=0.01)
    (tpot,) = points[sc.METRIC_TIME_PER_OUTPUT_TOKEN]
    assert tpot[1].count == 2 and 0 < tpot[1].max < durations[1].max

    assert points[sc.METRIC_REQUESTS] == [
        ({**model, sc.REQUEST_FINISH_REASON: "length"}, points[sc.METRIC_REQUESTS][0][1])
    ]
    assert points[sc.METRIC_REQUESTS][0][1].value == 2
    (images,) = points[sc.METRIC_IMAGES]
    assert images[0] == model and images[1].value == 3
    tokens = {attributes[sc.GEN_AI_TOKEN_TYPE]: point.value for attributes, point in points[sc.METRIC_TOKENS]}
    assert tokens == {"input": sum(r.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] for r in requests), "output": 12}
    usage = {attributes[sc.GEN_AI_TOKEN_TYPE]: point for attributes, point in points[sc.METRIC_TOKEN_USAGE]}
    assert {kind: (point.count, point.sum) for kind, point in usage.items()} == {
        "input": (2, tokens["input"]),
        "output": (2, 12),
    }  # one point per request and token type
    assert list(usage["input"].explicit_bounds) == list(vt_metrics.TOKEN_USAGE_BUCKETS)

    (rss,) = points[sc.METRIC_PROCESS_MEMORY_USAGE]
    assert rss[0] == {} and rss[1].value > 10 << 20
    (self_time,) = points[sc.METRIC_SELF_TIME]
    assert self_time[1].value > 0
    assert sc.METRIC_GPU_MEMORY_USAGE not in points  # no GPU here: absent, never zero


def test_the_request_path_only_appends_and_the_collection_records(metered, cpu_pipeline):
    session, reader = metered
    cpu_pipeline([("describe this image", image(64, 64))], gen_config=GEN)
    assert len(session.telemetry.finished) == 1  # no sampler thread: nothing drained it yet
    (attributes, start_ns, first_ns, end_ns, error_type, _) = session.telemetry.finished[0]
    assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6 and start_ns < first_ns < end_ns and error_type is None
    assert collected(reader)[sc.METRIC_REQUEST_DURATION][0][1].count == 1
    assert len(session.telemetry.finished) == 0


def test_the_sampler_thread_drains_finished_requests(exporter, cpu_pipeline):
    reader = InMemoryMetricReader()
    session = vlmtrace.instrument(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[reader]),
        journal=None,
        sample_interval_ms=20,
    )
    try:
        cpu_pipeline([("describe this image", image(64, 64))], gen_config=GEN)
        finished = session.telemetry.finished
        for _ in range(200):
            if not finished:
                break
            session.sampler._stop.wait(0.01)
        assert not finished
    finally:
        vlmtrace.uninstrument()


def test_memory_gauges_per_gpu_come_from_the_sampled_readings():
    reader = InMemoryMetricReader()
    with fake_gpu.two_gpus():
        vlmtrace.instrument(
            tracer_provider=TracerProvider(),
            meter_provider=MeterProvider(metric_readers=[reader]),
            journal=None,
            sample_interval_ms=0,
        )
        try:
            points = collected(reader)
        finally:
            vlmtrace.uninstrument()

    def by_gpu(name):
        return {attributes[sc.HW_ID]: point.value for attributes, point in points[name]}

    assert by_gpu(sc.METRIC_GPU_MEMORY_USAGE) == {"gpu0": fake_gpu.USED[0], "gpu1": fake_gpu.USED[1]}
    assert by_gpu(sc.METRIC_GPU_MEMORY_LIMIT) == {"gpu0": fake_gpu.TOTAL[0], "gpu1": fake_gpu.TOTAL[1]}
    assert by_gpu(sc.METRIC_PROCESS_GPU_MEMORY_USAGE) == {"gpu0": fake_gpu.PROCESS[0], "gpu1": fake_gpu.PROCESS[1]}
    assert by_gpu(sc.METRIC_TORCH_ALLOCATED) == {f"gpu{i}": fake_gpu.TORCH[i].allocated for i in (0, 1)}
    assert by_gpu(sc.METRIC_TORCH_RESERVED) == {f"gpu{i}": fake_gpu.TORCH[i].reserved for i in (0, 1)}
    assert by_gpu(sc.METRIC_TORCH_INACTIVE_SPLIT) == {f"gpu{i}": fake_gpu.TORCH[i].inactive_split for i in (0, 1)}
    assert by_gpu(sc.METRIC_NATIVE) == {f"gpu{i}": fake_gpu.PROCESS[i] - fake_gpu.TORCH[i].reserved for i in (0, 1)}

    for name in (sc.METRIC_GPU_MEMORY_USAGE, sc.METRIC_GPU_MEMORY_LIMIT):  # the hardware conventions' attributes
        assert {attributes[sc.HW_ID]: attributes for attributes, _ in points[name]}["gpu1"] == {
            sc.HW_ID: "gpu1",
            sc.HW_VENDOR: "NVIDIA",
            sc.HW_MODEL: fake_gpu.MODEL,
            sc.HW_NAME: f"{fake_gpu.MODEL} (gpu1)",
            sc.HW_DRIVER_VERSION: "999.99",
        }
    assert all(set(attributes) == {sc.HW_ID} for attributes, _ in points[sc.METRIC_TORCH_ALLOCATED])


def test_time_to_first_token_and_per_output_token_count_successful_responses_only():
    reader = InMemoryMetricReader()
    metrics = vt_metrics.Metrics(MeterProvider(metric_readers=[reader]).get_meter("vlmtrace"))
    request = {sc.GEN_AI_REQUEST_MODEL: "m", sc.GEN_AI_USAGE_OUTPUT_TOKENS: 4}
    second = 1_000_000_000
    metrics.finished.extend(
        [
            ({**request, sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"]}, 0, second, 4 * second, None),
            ({**request, sc.GEN_AI_RESPONSE_FINISH_REASONS: ["abort"]}, 0, second, 4 * second, None),
            (request, 0, second, 4 * second, "RuntimeError"),
        ]
    )
    points = collected(reader)

    assert sum(point.count for _, point in points[sc.METRIC_REQUEST_DURATION]) == 3  # every request
    (ttft,) = points[sc.METRIC_TIME_TO_FIRST_TOKEN]
    (tpot,) = points[sc.METRIC_TIME_PER_OUTPUT_TOKEN]
    assert (ttft[1].count, ttft[1].sum, tpot[1].count, tpot[1].sum) == (1, 1.0, 1, 1.0)


def test_the_request_histograms_carry_exemplars_of_the_request_spans(metered, exporter, cpu_pipeline):
    _session, reader = metered
    cpu_pipeline([("describe this image", image(64, 64))], gen_config=GEN)
    points = collected(reader)  # the first collection: exemplars are those of measurements since the last one
    (request,) = [s for s in exporter.get_finished_spans() if s.name == "chat tiny-qwen2vl"]  # simple processor

    for name in (sc.METRIC_REQUEST_DURATION, sc.METRIC_TIME_TO_FIRST_TOKEN):
        (point,) = points[name]
        exemplars = point[1].exemplars
        assert [(e.trace_id, e.span_id) for e in exemplars] == [(request.context.trace_id, request.context.span_id)]


def test_one_gpu_is_labelled_from_the_scalar_reading():
    sample = {sc.MEM_DEVICES: [3], sc.MEM_GPU_USED: 7, sc.MEM_TORCH_ALLOCATED: 5}
    assert vt_metrics.per_device(sample, sc.MEM_GPU_USED) == [(3, 7)]
    assert vt_metrics.per_device({sc.MEM_DEVICES: [0, 1], sc.MEM_GPU_USED: 9}, sc.MEM_GPU_USED) == []
    assert vt_metrics.per_device({sc.MEM_HOST_RSS: 1}, sc.MEM_GPU_USED) == []


def test_metrics_off_records_nothing_and_keeps_no_queue(cpu_pipeline):
    reader = InMemoryMetricReader()
    session = vlmtrace.instrument(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[reader]),
        journal=None,
        sample_interval_ms=0,
        metrics=False,
    )
    try:
        cpu_pipeline([("describe this image", image(64, 64))], gen_config=GEN)
        assert session.metrics is None and session.telemetry.finished is None
        assert collected(reader) == {}
    finally:
        vlmtrace.uninstrument()


@pytest.mark.usefixtures("fresh_global_meter_provider")
def test_without_a_meter_provider_none_is_installed_and_the_instruments_are_the_apis():
    session = vlmtrace.instrument(tracer_provider=TracerProvider(), journal=None, sample_interval_ms=0)
    try:
        assert not isinstance(metrics.get_meter_provider(), MeterProvider)
        session.metrics.finished.append(({}, 0, None, 1, None))
        session.metrics.drain()  # into the API's proxy instruments: recorded nowhere, no error
        assert not session.metrics.finished
    finally:
        vlmtrace.uninstrument()


def test_instrumenting_again_into_the_same_provider_reports_from_the_new_session():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    for _ in range(2):
        vlmtrace.instrument(
            tracer_provider=TracerProvider(), meter_provider=provider, journal=None, sample_interval_ms=0
        )
        points = collected(reader)
        vlmtrace.uninstrument()
        (rss,) = points[sc.METRIC_PROCESS_MEMORY_USAGE]
        assert rss[1].value > 0
    assert sc.METRIC_PROCESS_MEMORY_USAGE not in collected(reader)  # uninstrumented: the callbacks report nothing


@pytest.mark.collector
@pytest.mark.usefixtures("fresh_global_tracer_provider", "fresh_global_meter_provider")
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_metrics_reach_a_real_collector_with_the_traces_configuration(otlp_collector, cpu_pipeline, protocol):
    endpoint = otlp_collector.http_endpoint if protocol == "http/protobuf" else otlp_collector.grpc_endpoint
    with fake_gpu.two_gpus():
        provider = vlmtrace.configure(endpoint, protocol=protocol, service_name="metrics-test")
        vlmtrace.instrument(journal=None, sample_interval_ms=50)
        try:
            cpu_pipeline([("describe this image", image(64, 64))], gen_config=GEN)
            assert vlmtrace.flush()
        finally:
            vlmtrace.uninstrument()
            provider.shutdown()
            metrics.get_meter_provider().shutdown()

    (duration,) = otlp_collector.wait_for_points(lambda p: p.metric == sc.METRIC_REQUEST_DURATION)[-1:]
    assert duration.data_type == "Histogram" and duration.unit == "s" and duration.count == 1
    assert duration.attributes[sc.GEN_AI_REQUEST_MODEL] == "tiny-qwen2vl"
    assert duration.bounds == list(vt_metrics.REQUEST_DURATION_BUCKETS)
    assert duration.resource["service.name"] == "metrics-test"
    usage = otlp_collector.wait_for_points(lambda p: p.metric == sc.METRIC_GPU_MEMORY_USAGE)
    assert {p.attributes[sc.HW_ID]: p.value for p in usage} == {"gpu0": fake_gpu.USED[0], "gpu1": fake_gpu.USED[1]}
    assert usage[0].data_type == "Sum" and usage[0].monotonic is False and usage[0].unit == "By"
    tokens = otlp_collector.wait_for_points(lambda p: p.metric == sc.METRIC_TOKENS)
    assert {p.attributes[sc.GEN_AI_TOKEN_TYPE] for p in tokens} == {"input", "output"}
    assert all(p.monotonic is True for p in tokens)
    spans = otlp_collector.wait_for_spans(where=lambda s: s.name == "chat tiny-qwen2vl")
    assert spans[0].resource["service.instance.id"] == duration.resource["service.instance.id"]
    durations = otlp_collector.wait_for_points(lambda p: p.metric == sc.METRIC_REQUEST_DURATION)
    # the export after the request links its bucket to the request's trace (a later one has no new exemplar)
    assert [spans[0].trace_id] in [point.exemplar_trace_ids for point in durations]


def test_process_memory_usage_is_left_to_the_system_metrics_instrumentation_where_it_reports_it():
    system_metrics = pytest.importorskip("opentelemetry.instrumentation.system_metrics")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    vlmtrace.instrument(tracer_provider=TracerProvider(), meter_provider=provider, journal=None, sample_interval_ms=0)
    instrumentor = system_metrics.SystemMetricsInstrumentor(config={sc.METRIC_PROCESS_MEMORY_USAGE: None})
    try:
        assert sc.METRIC_PROCESS_MEMORY_USAGE in collected(reader)  # vlmtrace's, while nothing else reports it
        instrumentor.instrument(meter_provider=provider)
        rss = collected(reader)[sc.METRIC_PROCESS_MEMORY_USAGE]
        scopes = {
            m.name: sm.scope.name
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == sc.METRIC_PROCESS_MEMORY_USAGE
        }
        assert len(rss) == 1 and scopes == {sc.METRIC_PROCESS_MEMORY_USAGE: system_metrics.__name__}
    finally:
        instrumentor.uninstrument()
        vlmtrace.uninstrument()
