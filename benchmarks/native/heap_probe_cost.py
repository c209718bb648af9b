"""What glibc's `mallinfo2()` (heap bytes in use) costs in a served LMDeploy process, against the
resident-size read vlmtrace's host probe takes (a heap reading would place a leak of small
allocations in the stage that made it, where resident pages show it only where the heap next touches
fresh pages; docs/performance.md).

    python3 benchmarks/native/heap_probe_cost.py --backend pytorch [--calls 2000] [--batches 40]

Builds the pipeline, serves `--batches` seeded batches (1-4 image prompts), then times both reads
`--calls` times with the process idle, and again from a second thread while the same batches are
served (the engine's threads allocating: `mallinfo2` walks each arena's free chunks under its lock).
Prints one JSON object: per-call median and p99 in µs, and the heap's free chunks and size.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import threading
import time

import numpy as np
from workload import batches, build_pipeline, generation_config, timed

from vlmtrace.probes.host import HostMemoryProbe

FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]


def _timings(read, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        read()
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def _stats(micros: list[float]) -> dict[str, float]:
    return {"median_us": float(np.median(micros)), "p99_us": float(np.percentile(micros, 99)), "calls": len(micros)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("pytorch", "turbomind"), default="pytorch")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    host = HostMemoryProbe()
    reads = {"mallinfo2": libc.mallinfo2, "rss": host.rss_on_request_path}

    pipe = build_pipeline(args.backend)
    gen = generation_config()
    plan = batches(args.batches, seed=1)
    for batch in plan:
        timed(pipe, batch, gen)
    heap = libc.mallinfo2()
    result = {
        "backend": args.backend,
        "heap_after_warmup": {name: getattr(heap, name) for name in FIELDS},
        "idle": {name: _stats(_timings(read, args.calls)) for name, read in reads.items()},
    }

    under_load: dict[str, list[float]] = {name: [] for name in reads}
    serving = threading.Event()
    serving.set()

    def sample() -> None:
        while serving.is_set():
            for name, read in reads.items():
                under_load[name] += _timings(read, 10)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    latencies = [timed(pipe, batch, gen) for batch in plan]
    serving.clear()
    sampler.join()
    result["under_load"] = {name: _stats(micros) for name, micros in under_load.items()}
    result["batch_median_ms"] = float(np.median(latencies)) * 1e3
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
