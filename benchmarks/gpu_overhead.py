"""End-to-end latency of the tiny VLM pipeline with and without vlmtrace, in one process.

    python benchmarks/gpu_overhead.py --backend turbomind --json overhead-turbomind.json

The same seeded batches (1-4 image prompts of mixed sizes) run in blocks, alternately plain and
instrumented (ABBA order, so drift cancels); vlmtrace runs with its defaults (journal on, 100 ms
samples, no OTLP endpoint). Prints medians, p95, throughput and their ratios. Needs the GPU set-up
of benchmarks/gpu/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import vlmtrace
from workload import BACKENDS, batches, build_pipeline, generation_config, timed


def summarise(latencies: list[float], prompts: int, seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "batches": len(latencies),
        "median_ms": statistics.median(ordered) * 1000,
        "p95_ms": ordered[int(len(ordered) * 0.95)] * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
        "prompts_per_s": prompts / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args()

    pipe = build_pipeline(args.backend, max_batch_size=8)
    gen = generation_config()
    plan = batches(args.per_round, seed=1)
    for batch in plan * 2:
        timed(pipe, batch, gen)

    latencies: dict[str, list[float]] = {"plain": [], "vlmtrace": []}
    prompts = {"plain": 0, "vlmtrace": 0}
    busy = {"plain": 0.0, "vlmtrace": 0.0}
    readings = {"reads": 0, "measurements": 0}
    with tempfile.TemporaryDirectory() as journal_dir:
        for round_index in range(args.rounds):
            order = ("plain", "vlmtrace") if round_index % 2 == 0 else ("vlmtrace", "plain")
            for arm in order:
                if arm == "vlmtrace":
                    session = vlmtrace.instrument(journal=journal_dir)
                start = time.perf_counter()
                for batch in plan:
                    latencies[arm].append(timed(pipe, batch, gen))
                    prompts[arm] += len(batch.sizes)
                busy[arm] += time.perf_counter() - start
                if arm == "vlmtrace":
                    readings["reads"] += session.probe.reads
                    readings["measurements"] += session.probe.measurements
                    vlmtrace.uninstrument()
    pipe.close()

    plain = summarise(latencies["plain"], prompts["plain"], busy["plain"])
    traced = summarise(latencies["vlmtrace"], prompts["vlmtrace"], busy["vlmtrace"])
    paired = [t / p for t, p in zip(latencies["vlmtrace"], latencies["plain"])]
    result = {
        "backend": args.backend,
        "plain": plain,
        "vlmtrace": traced,
        "median_ratio": traced["median_ms"] / plain["median_ms"],
        "p95_ratio": traced["p95_ms"] / plain["p95_ms"],
        "throughput_ratio": traced["prompts_per_s"] / plain["prompts_per_s"],
        "paired_median_ratio": statistics.median(paired),
        "memory_reads_per_batch": readings["reads"] / traced["batches"],
        "memory_measurements_per_batch": readings["measurements"] / traced["batches"],
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
