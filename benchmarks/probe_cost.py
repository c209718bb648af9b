"""What one memory reading and one traced span cost, median and p99, side by side in one run.

    python benchmarks/probe_cost.py [--json out.json]

On a GPU machine run it after CUDA is up (it brings torch's CUDA up itself when torch sees a GPU);
without a GPU the device readings are skipped and say so. Compares the naive probe (three
`torch.cuda.*` calls) with vlmtrace's quick reading, and a bare OpenTelemetry span with a vlmtrace
span (probe + attributes + journal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from vlmtrace.config import Options
from vlmtrace.instrumentation.runtime import Telemetry
from vlmtrace.probes.memory import MemoryProbe

CALLS = 2000


def measure(fn: Callable[[], object], calls: int = CALLS) -> dict[str, float]:
    for _ in range(100):
        fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return {"median_us": statistics.median(samples) / 1000, "p99_us": samples[int(len(samples) * 0.99)] / 1000}


class DiscardingExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def _cuda_up() -> bool:
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    torch.zeros(1, device="cuda")
    return True


def probe_costs() -> dict[str, dict[str, float] | str]:
    results: dict[str, dict[str, float] | str] = {}
    if _cuda_up():
        import torch

        results["torch.cuda.memory_allocated()"] = measure(torch.cuda.memory_allocated)
        results["naive: allocated+reserved+memory_stats"] = measure(
            lambda: (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.memory_stats())
        )
        results["torch._C._cuda_memoryStats(0)"] = measure(lambda: torch._C._cuda_memoryStats(0))
    else:
        results["torch"] = "skipped: no CUDA device"
    for label, probes in (
        ("vlmtrace quick reading: host", ("host",)),
        ("vlmtrace quick reading: torch+host", ("torch", "host")),
        ("vlmtrace quick reading: torch+nvml+host", ("torch", "nvml", "host")),
    ):
        probe = MemoryProbe(probes, reuse_us=0)
        if "nvml" in probes and probe.status.get("nvml") != "ok":
            results[label] = f"skipped: {probe.status['nvml']}"
            continue
        probe.sample()
        results[label] = measure(probe.read)
        if "nvml" in probes:
            results["vlmtrace full sample (adds NVML per-process)"] = measure(probe.sample, calls=500)
        probe.close()
    return results


def span_costs() -> dict[str, dict[str, float]]:
    results = {}
    bare_provider = TracerProvider()
    bare_provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
    bare = bare_provider.get_tracer("bench")

    def bare_span():
        bare.start_span("x", attributes={"a": 1, "b": 2, "c": 3}).end()

    results["bare OpenTelemetry span, 3 attributes, batch processor"] = measure(bare_span)

    from vlmtrace.export.recorder import SpanRecorder
    from vlmtrace.export.tracing import open_tracing

    with tempfile.TemporaryDirectory() as journal_dir:
        options = Options.resolve({"journal": journal_dir, "sample_interval_ms": 0})
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
        tracing = open_tracing(options, provider)
        for label, reuse_us, bridged in (
            ("vlmtrace span (probe, attributes, journal), reading reused", 200, False),
            ("vlmtrace span (probe, attributes, journal), fresh readings", 0, False),
            ("vlmtrace span, fresh readings, + the SDK's span to a batch processor", 0, True),
        ):
            probe = MemoryProbe(options.probes, reuse_us=reuse_us)
            probe.sample()
            telemetry = Telemetry(SpanRecorder(tracing.journal, tracing.tracer if bridged else None), probe, options)

            def traced_span(telemetry=telemetry):
                telemetry.start("x", "bench", {"a": 1, "b": 2, "c": 3}).end()

            results[label] = measure(traced_span)
            probe.close()
        tracing.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results = {
        "host": os.uname().nodename,
        "python": sys.version.split()[0],
        "probes": probe_costs(),
        "spans": span_costs(),
    }
    for section in ("probes", "spans"):
        for label, value in results[section].items():
            text = (
                value
                if isinstance(value, str)
                else f"median {value['median_us']:8.1f} µs   p99 {value['p99_us']:8.1f} µs"
            )
            print(f"{label:62} {text}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
