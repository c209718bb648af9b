"""What the export side adds to one span, measured side by side in one process.

Three tracer providers run the same request-shaped span (8 attributes: stage, memory readings,
an int array) in interleaved rounds:
  sdk              the OpenTelemetry SDK with no processor
  sdk+journal      plus the journal processor (two os.write calls per span)
  sdk+journal+otlp plus the OTLP processor exporting to a port that refuses connections
Each span is timed on its own (start, attributes, end); rounds are short and rotate the order,
so load from elsewhere on the machine hits all three alike. The table gives median and p99 per
configuration and what each adds over the SDK alone. A fourth provider times the journal
processor's own on_start + on_end from inside (what the hooks cost, without their effect on the
rest of the span's path).

    PYTHONPATH=src python benchmarks/journal_overhead.py [--spans-per-round 250] [--rounds 160]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import socket
import statistics
import tempfile
import time

from opentelemetry.sdk.trace import TracerProvider

from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export.journal import JournalSpanProcessor, JournalWriter
from vlmtrace.export.otlp import otlp_span_processor

ATTRIBUTES = {
    semconv.STAGE: semconv.STAGE_VISION_INFER,
    semconv.VISION_IMAGES: 4,
    semconv.VISION_IMAGE_WIDTHS: (640, 1024, 448, 896),
    semconv.MEM_TORCH_ALLOCATED: 6_442_450_944,
    semconv.MEM_TORCH_RESERVED: 8_589_934_592,
    semconv.MEM_GPU_USED: 85_899_345_920,
    semconv.MEM_NATIVE: 21_474_836_480,
    semconv.MEM_HOST_RSS: 2_500_000_000,
}


class TimedJournalProcessor(JournalSpanProcessor):
    """The journal processor, timing its two hooks; `hooks_ns` gets on_start + on_end per span."""

    def __init__(self, writer: JournalWriter) -> None:
        super().__init__(writer)
        self.hooks_ns: list[int] = []
        self._start_ns = 0

    def on_start(self, span, parent_context=None) -> None:
        started = time.perf_counter_ns()
        super().on_start(span, parent_context)
        self._start_ns = time.perf_counter_ns() - started

    def on_end(self, span) -> None:
        started = time.perf_counter_ns()
        super().on_end(span)
        self.hooks_ns.append(self._start_ns + time.perf_counter_ns() - started)


def tracer_for(journal_dir: str | None, otlp_endpoint: str | None, journal_processor=JournalSpanProcessor):
    provider = TracerProvider(shutdown_on_exit=False)
    closers = []
    writer = None
    if journal_dir is not None:
        writer = JournalWriter.open(journal_dir, max_bytes=64 << 20, max_files=2, resource={}, versions={})
        provider.add_span_processor(journal_processor(writer))
        closers.append(writer.close)
    if otlp_endpoint is not None:
        options = Options.resolve({"otlp_endpoint": otlp_endpoint, "otlp_protocol": "grpc"}, environ={})
        otlp = otlp_span_processor(options, writer.note_dropped if writer else None)
        provider.add_span_processor(otlp)
        closers.insert(0, otlp.shutdown)
    return provider.get_tracer("benchmark"), closers


def time_spans(tracer, count: int, out: list[int]) -> None:
    clock = time.perf_counter_ns
    for _ in range(count):
        started = clock()
        with tracer.start_as_current_span(semconv.SPAN_VISION_INFER, attributes=ATTRIBUTES):
            pass
        out.append(clock() - started)


def percentile(sorted_values: list[int], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans-per-round", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=160)
    args = parser.parse_args()

    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    endpoint = f"127.0.0.1:{refused.getsockname()[1]}"
    with tempfile.TemporaryDirectory() as scratch:
        timed_processors: list[TimedJournalProcessor] = []

        def timed_processor(writer: JournalWriter) -> TimedJournalProcessor:
            timed_processors.append(TimedJournalProcessor(writer))
            return timed_processors[0]

        configurations = {
            "sdk": tracer_for(None, None),
            "sdk+journal": tracer_for(os.path.join(scratch, "a"), None),
            "sdk+journal+otlp(down)": tracer_for(os.path.join(scratch, "b"), endpoint),
            "hooks": tracer_for(os.path.join(scratch, "c"), None, timed_processor),
        }
        timings: dict[str, list[int]] = {name: [] for name in configurations}
        for tracer, _ in configurations.values():
            time_spans(tracer, args.spans_per_round, [])  # warm-up: OTLP queue full, caches warm
        for round_index in range(args.rounds):
            order = list(configurations.items())
            order = order[round_index % len(order):] + order[: round_index % len(order)]
            gc.collect()
            for name, (tracer, _) in order:
                time_spans(tracer, args.spans_per_round, timings[name])
        for _, closers in configurations.values():
            for close in closers:
                close()

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
          f"{args.rounds} rounds x {args.spans_per_round} spans per configuration, interleaved")
    base = sorted(timings["sdk"])
    base_median, base_p99 = statistics.median(base), percentile(base, 0.99)
    print(f"{'configuration':<24}{'median us':>10}{'p99 us':>10}{'median x':>10}{'added median us':>17}{'added p99 us':>14}")
    del timings["hooks"]
    hooks = sorted(timed_processors[0].hooks_ns[args.spans_per_round:])  # without the warm-up round
    for name, values in timings.items():
        values.sort()
        median, p99 = statistics.median(values), percentile(values, 0.99)
        print(f"{name:<24}{median / 1e3:>10.1f}{p99 / 1e3:>10.1f}{median / base_median:>10.2f}"
              f"{(median - base_median) / 1e3:>17.1f}{(p99 - base_p99) / 1e3:>14.1f}")
    print(f"journal processor on_start + on_end, timed inside: median {statistics.median(hooks) / 1e3:.1f} us, "
          f"p99 {percentile(hooks, 0.99) / 1e3:.1f} us")


if __name__ == "__main__":
    main()
