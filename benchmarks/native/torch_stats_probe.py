"""What the compiled library of torch's allocator costs against torch's own calls (issues 14 and 18).

    python3 benchmarks/native/torch_stats_probe.py [--calls 20000] [--releases 20]

Builds (or loads) vlmtrace's compiled library as a session's probe does (probes/native_counters.py: the
system's C++ compiler and the installed torch's headers), which checks its five counters against
torch's statistics dict; then checks them again 50 times while tensors come and go, and times both
reads. Then the cache guard's release, both ways: `--releases` times, 1 GiB cached in 64 segments is
released by torch.cuda.empty_cache() or through the library, while a Python thread ticks every 0.1 ms;
the longest the ticker waited shows how long the release held the GIL. Prints one JSON object. Needs a
CUDA device.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import threading
import time

import torch

from vlmtrace.probes.torch_allocator import TorchAllocatorProbe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--releases", type=int, default=20)
    args = parser.parse_args()
    torch.empty(1, device="cuda")  # CUDA up, as in a served process
    probe = TorchAllocatorProbe(native=True)
    started = time.perf_counter()
    probe.active()  # what a session's first reading does: starts the build
    probe.native.wait()
    report: dict = {"torch": torch.__version__, "state": probe.native_state, "ready_s": round(time.perf_counter() - started, 2)}
    if probe.native_state == "ready":
        kept, agree = [], 0
        for step in range(50):
            kept.append(torch.empty((step + 1) * 1_000_003, dtype=torch.uint8, device="cuda"))
            if step % 3 == 0:
                kept.pop(0)
            agree += tuple(probe.read_from_torch(0)) == probe.native.read(0)
        report["agree_of_50"] = agree
        for name, read in (("python_nested_dict", probe.read_from_torch), ("compiled", probe.native.read)):
            begin = time.perf_counter_ns()
            for _ in range(args.calls):
                read(0)
            report[f"{name}_us"] = round((time.perf_counter_ns() - begin) / args.calls / 1000, 3)
        del kept
        report["release"] = {name: timed_releases(release, args.releases) for name, release in
                             (("torch_empty_cache", lambda: torch.cuda.empty_cache()),
                              ("compiled", lambda: probe.native.release_cache(0)))}
    print(json.dumps(report))


def tick(ticks: list[int], stop: threading.Event) -> None:
    while not stop.is_set():
        ticks.append(time.perf_counter_ns())
        time.sleep(0.0001)


def timed_releases(release, count: int) -> dict:
    """Each time: 1 GiB of 16 MiB segments cached, then released while a Python thread ticks; the
    release's duration and the ticker's longest wait during it (medians over `count`)."""
    durations, stalls = [], []
    for _ in range(count):
        blocks = [torch.empty(16 << 20, dtype=torch.uint8, device="cuda") for _ in range(64)]
        del blocks
        torch.cuda.synchronize()
        cached = torch.cuda.memory_reserved(0)
        ticks: list[int] = []
        stop = threading.Event()
        ticker = threading.Thread(target=tick, args=(ticks, stop))
        ticker.start()
        time.sleep(0.005)
        begin = time.perf_counter_ns()
        release()
        end = time.perf_counter_ns()
        time.sleep(0.002)
        stop.set()
        ticker.join()
        during = [t for t in ticks if begin <= t <= end]
        edges = [begin, *during, max([t for t in ticks if t > end] or [end])]
        durations.append((end - begin) / 1e6)
        stalls.append(max(b - a for a, b in itertools.pairwise(edges)) / 1e6)
        assert torch.cuda.memory_reserved(0) <= cached - (1 << 30), "the release left the segments cached"
    return {"median_ms": round(statistics.median(durations), 3), "ticker_longest_wait_median_ms":
            round(statistics.median(stalls), 3), "ticker_longest_wait_max_ms": round(max(stalls), 3)}


if __name__ == "__main__":
    main()
