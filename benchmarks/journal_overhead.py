"""What the export side adds to one span, measured side by side in one process.

The same request-shaped span (8 attributes: stage, memory readings, an int array) runs in
interleaved rounds through these configurations:
  sdk                        the OpenTelemetry SDK with no processor
  sdk+journal(sync)          plus the journal processor, each record written by the span's thread
  sdk+journal                plus the journal processor, records queued and written by the journal's
                             flushing thread (the default)
  sdk+journal+otlp(down)     plus the OTLP processor exporting to a port that refuses connections
  recorder                   vlmtrace's own span recorder (export/recorder.py), no journal
  recorder+journal(sync)     its journal records written by the span's thread
  recorder+journal           its journal records queued for the flushing thread (the default)
Each span is timed on its own (start, end); rounds are short and rotate the order, so load from
elsewhere on the machine hits all configurations alike. The loop is single-threaded and never waits,
so the flushing thread's work (it needs the GIL) lands inside the timed spans: this is the request
path's cost with no idle time to hide the background work in. The table gives median and p99 per
configuration and what each adds over its base (sdk, or recorder). Two more providers time the
journal processor's own on_start + on_end from inside, sync and queued.

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

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from vlmtrace import semconv
from vlmtrace.config import Options
from vlmtrace.export.journal import JournalSpanProcessor, JournalWriter
from vlmtrace.export.otlp import otlp_span_processor
from vlmtrace.export.recorder import SpanRecorder

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


MEMORY = {key: value for key, value in ATTRIBUTES.items() if key.startswith("vlmtrace.mem.")}
RECORDED_ATTRIBUTES = {key: value for key, value in ATTRIBUTES.items() if key not in MEMORY}


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


def open_journal(journal_dir: str, sync: bool) -> JournalWriter:
    return JournalWriter.open(journal_dir, max_bytes=64 << 20, max_files=2, resource={}, versions={}, sync=sync)


def sdk_spans(
    journal_dir: str | None, otlp_endpoint: str | None, sync: bool = False, journal_processor=JournalSpanProcessor
):
    """A function that runs and times `count` SDK spans, and the closers of what it opened."""
    provider = TracerProvider(shutdown_on_exit=False)
    closers = []
    writer = None
    if journal_dir is not None:
        writer = open_journal(journal_dir, sync)
        provider.add_span_processor(journal_processor(writer))
        closers.append(writer.close)
    if otlp_endpoint is not None:
        options = Options.resolve({"otlp_endpoint": otlp_endpoint, "otlp_protocol": "grpc"}, environ={})
        otlp = otlp_span_processor(options, writer.note_dropped if writer else None)
        provider.add_span_processor(otlp)
        closers.insert(0, otlp.shutdown)
    tracer = provider.get_tracer("benchmark")

    def run(count: int, out: list[int]) -> None:
        clock = time.perf_counter_ns
        for _ in range(count):
            started = clock()
            with tracer.start_as_current_span(semconv.SPAN_VISION_INFER, attributes=ATTRIBUTES):
                pass
            out.append(clock() - started)

    return run, closers


def recorded_spans(journal_dir: str | None, sync: bool = False):
    """The same for vlmtrace's own spans, through the recorder (a root span with its memory reading)."""
    writer = open_journal(journal_dir, sync) if journal_dir is not None else None
    recorder = SpanRecorder(writer, None)
    root = Context()

    def run(count: int, out: list[int]) -> None:
        clock = time.perf_counter_ns
        for _ in range(count):
            started = clock()
            span = recorder.start(
                semconv.SPAN_VISION_INFER, root, SpanKind.INTERNAL, dict(RECORDED_ATTRIBUTES), memory=MEMORY
            )
            recorder.end(span)
            out.append(clock() - started)

    return run, [writer.close] if writer is not None else []


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
        timed_processors: dict[str, TimedJournalProcessor] = {}

        def timed(label: str):
            def make(writer: JournalWriter) -> TimedJournalProcessor:
                timed_processors[label] = TimedJournalProcessor(writer)
                return timed_processors[label]

            return make

        def scratch_dir(name: str) -> str:
            return os.path.join(scratch, name)

        configurations = {
            "sdk": sdk_spans(None, None),
            "sdk+journal(sync)": sdk_spans(scratch_dir("a"), None, sync=True),
            "sdk+journal": sdk_spans(scratch_dir("b"), None),
            "sdk+journal+otlp(down)": sdk_spans(scratch_dir("c"), endpoint),
            "recorder": recorded_spans(None),
            "recorder+journal(sync)": recorded_spans(scratch_dir("d"), sync=True),
            "recorder+journal": recorded_spans(scratch_dir("e")),
            "hooks(sync)": sdk_spans(scratch_dir("f"), None, sync=True, journal_processor=timed("sync")),
            "hooks": sdk_spans(scratch_dir("g"), None, journal_processor=timed("queued")),
        }
        timings: dict[str, list[int]] = {name: [] for name in configurations}
        for run, _ in configurations.values():
            run(args.spans_per_round, [])  # warm-up: OTLP queue full, caches warm
        for round_index in range(args.rounds):
            order = list(configurations.items())
            order = order[round_index % len(order) :] + order[: round_index % len(order)]
            gc.collect()
            for name, (run, _) in order:
                run(args.spans_per_round, timings[name])
        for _, closers in configurations.values():
            for close in closers:
                close()

    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{args.rounds} rounds x {args.spans_per_round} spans per configuration, interleaved"
    )
    print(
        f"{'configuration':<24}{'median us':>10}{'p99 us':>10}{'median x':>10}{'added median us':>17}{'added p99 us':>14}"
    )
    bases = {}
    for name, values in timings.items():
        if name.startswith("hooks"):
            continue
        values.sort()
        median, p99 = statistics.median(values), percentile(values, 0.99)
        base = name.split("+")[0]
        base_median, base_p99 = bases.setdefault(base, (median, p99))
        print(
            f"{name:<24}{median / 1e3:>10.1f}{p99 / 1e3:>10.1f}{median / base_median:>10.2f}"
            f"{(median - base_median) / 1e3:>17.1f}{(p99 - base_p99) / 1e3:>14.1f}"
        )
    for label, processor in timed_processors.items():
        hooks = sorted(processor.hooks_ns[args.spans_per_round :])  # without the warm-up round
        print(
            f"journal processor on_start + on_end ({label}), timed inside: "
            f"median {statistics.median(hooks) / 1e3:.1f} us, p99 {percentile(hooks, 0.99) / 1e3:.1f} us"
        )


if __name__ == "__main__":
    main()
