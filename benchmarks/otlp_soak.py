"""Soak: 100 000 spans with the OTLP collector down, against the same load with no OTLP at all.

Two tracer providers in one process, both with the journal (default size limits) and a
sampler thread writing a `sample` record every 100 ms, as instrument() sets them up:
  no-otlp     journal only
  otlp-down   journal + OTLP/gRPC to a loopback port that refuses connections (default queue)
A "batch" is request-shaped: a pipeline span, two request spans, six stage spans under each
(15 spans), and --work-us of CPU work inside the engine spans standing in for the model.
Batches alternate between the two in chunks, so drift and noise hit both alike. Reported:
batch latency (median, p99) for each and their ratio, the process RSS before and after the
otlp-down spans, the most spans ever queued for export, and the dropped-span count.

    PYTHONPATH=src python benchmarks/otlp_soak.py [--spans 100000] [--work-us 1000]
"""

from __future__ import annotations

import argparse
import array
import gc
import os
import platform
import socket
import statistics
import tempfile
import threading
import time

import psutil
from opentelemetry.sdk.trace import TracerProvider

from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export.journal import JournalSpanProcessor, JournalWriter
from vlmtrace.export.otlp import otlp_span_processor

SPANS_PER_BATCH = 15  # the pipeline span, and per request (two) the request span and STAGES
CHUNK_BATCHES = 50
STAGES = (
    semconv.SPAN_VISION_PREPROCESS,
    semconv.SPAN_VISION_INFER,
    semconv.SPAN_VISION_FORWARD,
    semconv.SPAN_TURBOMIND_STREAM,
    semconv.SPAN_PYTORCH_STREAM,
    semconv.SPAN_EMPTY_CACHE,
)


class Service:
    """One provider with the journal, optionally OTLP, and a 100 ms sampler thread."""

    def __init__(self, journal_dir: str, otlp_endpoint: str | None) -> None:
        defaults = Options()
        self.writer = JournalWriter.open(
            journal_dir,
            max_bytes=defaults.journal_max_bytes,
            max_files=defaults.journal_max_files,
            resource={},
            versions={},
        )
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(JournalSpanProcessor(self.writer))
        self.otlp = None
        if otlp_endpoint is not None:
            options = Options.resolve({"otlp_endpoint": otlp_endpoint, "otlp_protocol": "grpc"}, environ={})
            self.otlp = otlp_span_processor(options, self.writer.note_dropped, on_warning=self.writer.warn)
            provider.add_span_processor(self.otlp)
        self.tracer = provider.get_tracer("soak")
        self.latencies = array.array("q")  # raw storage: no Python object per batch to pin allocator arenas
        self.most_queued = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(0.1):
            self.writer.write_sample(time.time_ns(), {semconv.MEM_HOST_RSS: process.memory_info().rss})

    def batch(self, index: int, work_ns: int) -> None:
        tracer = self.tracer
        started = time.perf_counter_ns()
        with tracer.start_as_current_span(semconv.SPAN_PIPELINE_INFER, attributes={semconv.PIPELINE_PROMPTS: 2}):
            for request in range(2):
                with tracer.start_as_current_span(
                    "chat tiny-vl", attributes={semconv.LMDEPLOY_SESSION_ID: index * 2 + request}
                ):
                    for stage in STAGES:
                        with tracer.start_as_current_span(stage, attributes={semconv.MEM_TORCH_ALLOCATED: index}):
                            if stage == semconv.SPAN_TURBOMIND_STREAM:
                                spin(work_ns // 2)
        self.latencies.append(time.perf_counter_ns() - started)
        if self.otlp is not None:
            self.most_queued = max(self.most_queued, self.otlp.queued)

    def close(self) -> None:
        self._stop.set()
        self._sampler.join()
        if self.otlp is not None:
            self.otlp.shutdown()
        self.writer.close()


def spin(duration_ns: int) -> None:
    end = time.perf_counter_ns() + duration_ns
    while time.perf_counter_ns() < end:
        pass


def percentile(values: array.array, fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=100_000, help="spans per configuration")
    parser.add_argument("--work-us", type=int, default=1000, help="CPU work per batch standing in for the model")
    args = parser.parse_args()
    batches = args.spans // SPANS_PER_BATCH
    work_ns = args.work_us * 1000

    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening
    process = psutil.Process()
    with tempfile.TemporaryDirectory() as scratch:
        plain = Service(os.path.join(scratch, "plain"), None)
        down = Service(os.path.join(scratch, "down"), f"127.0.0.1:{refused.getsockname()[1]}")
        for index in range(200):  # warm-up: the OTLP queue fills, the exporter starts retrying
            plain.batch(index, work_ns)
            down.batch(index, work_ns)
        del plain.latencies[:], down.latencies[:]
        gc.collect()
        rss_before = process.memory_info().rss
        rss_peak = rss_before
        rss_checkpoints = []
        checkpoint_every = max(CHUNK_BATCHES, batches // 10 // CHUNK_BATCHES * CHUNK_BATCHES)
        started = time.monotonic()
        for first in range(0, batches, CHUNK_BATCHES):
            for service in (plain, down) if first // CHUNK_BATCHES % 2 == 0 else (down, plain):
                for index in range(first, min(first + CHUNK_BATCHES, batches)):
                    service.batch(index, work_ns)
            rss_peak = max(rss_peak, process.memory_info().rss)
            if (first + CHUNK_BATCHES) % checkpoint_every == 0:
                rss_checkpoints.append(process.memory_info().rss)
        elapsed = time.monotonic() - started
        gc.collect()
        rss_after = process.memory_info().rss
        dropped_before_shutdown = down.otlp.dropped
        plain.close()
        down.close()
        journal_mib = (
            sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(scratch) for name in names)
            / 2**20
        )

    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{batches} batches x {SPANS_PER_BATCH} spans per configuration, {args.work_us} us of work per batch; "
        f"{elapsed:.0f} s"
    )
    print(f"{'configuration':<14}{'median ms':>10}{'p99 ms':>10}")
    for name, service in (("no-otlp", plain), ("otlp-down", down)):
        print(
            f"{name:<14}{statistics.median(service.latencies) / 1e6:>10.3f}"
            f"{percentile(service.latencies, 0.99) / 1e6:>10.3f}"
        )
    print(
        f"otlp-down / no-otlp: median {statistics.median(down.latencies) / statistics.median(plain.latencies):.3f}, "
        f"p99 {percentile(down.latencies, 0.99) / percentile(plain.latencies, 0.99):.3f}"
    )
    print(
        f"RSS after warm-up {rss_before / 2**20:.1f} MiB, peak {rss_peak / 2**20:.1f} MiB, "
        f"after {rss_after / 2**20:.1f} MiB: growth {(rss_after - rss_before) / 2**20:+.1f} MiB "
        f"over {2 * batches * SPANS_PER_BATCH} spans"
    )
    print("RSS every tenth of the run (MiB): " + " ".join(f"{rss / 2**20:.1f}" for rss in rss_checkpoints))
    print(
        f"most spans queued for OTLP {down.most_queued} (bound {Options().otlp_max_queue_size}); "
        f"dropped {dropped_before_shutdown} before shutdown, {down.otlp.dropped} in all (warm-up included); "
        f"journal files {journal_mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()
