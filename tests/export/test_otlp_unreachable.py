"""An OTLP endpoint that refuses or hangs: the service never waits, memory stays bounded, every drop is counted."""

from __future__ import annotations

import gc
import time
import weakref

import psutil
import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from tests.export.child_process import start_python
from tests.export.journal_lines import of_kind, records_of
from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export.journal import JournalSpanProcessor, JournalWriter
from vlmtrace.export.otlp import otlp_span_processor

SHUTDOWN_TIMEOUT_MS = 1000
SHUTDOWN_SLACK_S = 1.5  # thread start-up and the exporter's abort, on a loaded two-core runner


def pipeline(processor_options: Options, journal_dir):
    """A provider with the journal and the OTLP processor that vlmtrace.configure() installs."""
    writer = JournalWriter.open(
        str(journal_dir),
        max_bytes=processor_options.journal_max_bytes,
        max_files=processor_options.journal_max_files,
        resource={},
        versions={},
    )
    otlp = otlp_span_processor(processor_options, writer.note_dropped, on_warning=writer.warn)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(JournalSpanProcessor(writer))
    provider.add_span_processor(otlp)
    return provider, otlp, writer


def options(endpoint: str, protocol: str, **more) -> Options:
    settings = {
        "otlp_endpoint": endpoint,
        "otlp_protocol": protocol,
        "otlp_max_queue_size": 64,
        "shutdown_timeout_ms": SHUTDOWN_TIMEOUT_MS,
    }
    settings.update(more)
    return Options.resolve(settings, environ={})


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("endpoint_fixture", ["refused_endpoint", "blackhole_endpoint"])
def test_spans_are_dropped_and_counted_and_shutdown_returns_in_time(request, tmp_path, protocol, endpoint_fixture):
    endpoint = request.getfixturevalue(endpoint_fixture)
    provider, otlp, writer = pipeline(options(endpoint, protocol), tmp_path / "j")
    tracer = provider.get_tracer("test")
    most_queued = 0
    run_started = time.monotonic()
    for i in range(3000):
        with tracer.start_as_current_span("lmdeploy.vision.infer", attributes={semconv.VISION_IMAGES: i}):
            pass
        most_queued = max(most_queued, otlp.queued)

    started = time.monotonic()
    otlp.shutdown()
    shutdown_s = time.monotonic() - started
    writer.close()

    assert most_queued <= 64
    assert shutdown_s < SHUTDOWN_TIMEOUT_MS / 1000 + SHUTDOWN_SLACK_S
    assert otlp.dropped == 3000
    records = records_of(tmp_path / "j")
    assert len(of_kind(records, "end")) == 3000  # the journal has every span the endpoint lost
    dropped = of_kind(records, "dropped")
    assert dropped[-1]["otlp_spans"] == 3000
    assert 2 <= len(dropped) <= 2 + (time.monotonic() - run_started)  # one a second at most, plus the final total
    assert {w["source"] for w in of_kind(records, "warning")} == {"otlp"}


def test_soak_with_the_collector_down_keeps_queue_memory_and_disk_bounded(tmp_path, refused_endpoint):
    """30 000 spans in request-shaped batches (the 100 000-span soak is benchmarks/otlp_soak.py)."""
    soak_options = options(
        refused_endpoint, "grpc", otlp_max_queue_size=256, journal_max_bytes=1 << 20, journal_max_files=2
    )
    provider, otlp, writer = pipeline(soak_options, tmp_path / "j")
    tracer = provider.get_tracer("test")
    process = psutil.Process()

    def batch(index):
        with tracer.start_as_current_span(semconv.SPAN_PIPELINE_INFER, attributes={semconv.PIPELINE_PROMPTS: 4}):
            for _ in range(2):
                with tracer.start_as_current_span("chat tiny-vl", attributes={semconv.LMDEPLOY_SESSION_ID: index}):
                    for name in (
                        semconv.SPAN_VISION_PREPROCESS,
                        semconv.SPAN_PYTORCH_STREAM,
                        semconv.SPAN_VISION_INFER,
                        semconv.SPAN_VISION_INFER,
                        semconv.SPAN_TURBOMIND_STREAM,
                        semconv.SPAN_EMPTY_CACHE,
                    ):
                        with tracer.start_as_current_span(name, attributes={semconv.MEM_TORCH_ALLOCATED: index}):
                            pass
        writer.write_sample(time.time_ns(), {semconv.MEM_HOST_RSS: index})

    for index in range(200):  # warm-up: queue full, journal rotating, exporter retrying
        batch(index)
    gc.collect()
    rss_before = process.memory_info().rss
    most_queued = 0
    for index in range(200, 2000):  # 15 spans a batch
        batch(index)
        most_queued = max(most_queued, otlp.queued)
    gc.collect()
    rss_growth = process.memory_info().rss - rss_before
    otlp.shutdown()
    writer.close()

    assert most_queued <= 256
    assert rss_growth < 32 * 1024 * 1024
    assert otlp.dropped == 2000 * 15
    files = list((tmp_path / "j").iterdir())
    assert len(files) <= 2
    assert sum(f.stat().st_size for f in files) < 2 * ((1 << 20) + 4096)
    assert of_kind(records_of(tmp_path / "j"), "dropped")[-1]["otlp_spans"] == 30000


class _RememberEnded(SpanProcessor):
    """Keeps a weak reference to every span the SDK hands to processors at end."""

    def __init__(self) -> None:
        self.ended: list[weakref.ref] = []

    def on_end(self, span) -> None:
        self.ended.append(weakref.ref(span))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_failed_export_frees_its_spans_without_waiting_for_the_cyclic_gc(monkeypatch, refused_endpoint, protocol):
    """A failed export leaves a reference cycle through the exporter's traceback; it must not hold the batch."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # give up on the endpoint after a second
    otlp = otlp_span_processor(options(refused_endpoint, protocol), None)
    remembered = _RememberEnded()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(otlp)
    provider.add_span_processor(remembered)
    tracer = provider.get_tracer("test")
    gc.collect()
    gc.disable()
    try:
        for _ in range(40):
            with tracer.start_as_current_span("lost"):
                pass
        assert otlp.force_flush(timeout_millis=10_000)
        assert otlp.dropped == 40
        assert [ref for ref in remembered.ended if ref() is not None] == []
    finally:
        gc.enable()
        otlp.shutdown()


EXIT_WITHOUT_UNINSTRUMENT = """
import atexit, os, sys, time
atexit.register(lambda: print(f"{time.monotonic() - ended:.3f}"))  # registered first: runs after every other hook
import vlmtrace
os.environ["VLMTRACE_SHUTDOWN_TIMEOUT_MS"] = "500"
vlmtrace.configure(sys.argv[1], protocol=sys.argv[3])
session = vlmtrace.instrument(journal=sys.argv[2], sample_interval_ms=0)
for _ in range(600):
    session.telemetry.start("lmdeploy.vision.infer", "vision.infer").end()
ended = time.monotonic()
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("endpoint_fixture", ["refused_endpoint", "blackhole_endpoint"])
def test_exit_with_configured_export_takes_at_most_the_shutdown_timeout_for_traces_and_metrics(
    request, tmp_path, endpoint_fixture, protocol
):
    endpoint = request.getfixturevalue(endpoint_fixture)
    child = start_python("-c", EXIT_WITHOUT_UNINSTRUMENT, endpoint, str(tmp_path / "j"), protocol)
    out, err = child.communicate(timeout=60)

    assert child.returncode == 0, err
    assert float(out.split()[-1]) <= 0.5 + 0.1
    records = records_of(tmp_path / "j")
    assert records[-1]["k"] == "end_marker" and len(of_kind(records, "end")) == 600
