"""What the cache guard's vision-stage watch costs the request path, and how soon a wake reaches it (CPU).

1. Per span end, with `trim_cache` on and nothing crossed: a stage that is not watched, a vision stage
   under a size bound (the devices' summed cache compared), under a headroom bound (every device's
   free memory compared); and a whole vision span, start and end, with the watch and without it.
2. From `Sampler.wake()` to the guard's sink holding the woken sample: while the other threads wait
   (the GIL free), and while one spins in Python (the sampler waits for the GIL).

Two stand-in GPUs (tests/support/fake_gpu.py) give the readings; everything else is vlmtrace's code.

    PYTHONPATH=src:. python benchmarks/cache_guard_cost.py
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
import timeit

from opentelemetry.sdk.trace import TracerProvider
from tests.support import fake_gpu

import vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.probes.memory import MemoryProbe
from vlmtrace.probes.sampler import Sampler

CALLS = 200_000
SPANS = 1000
ROUNDS = 40


def best_ns(call, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e9


def span_end_costs(bound: str) -> None:
    """`bound` is never crossed here: the common case, where the watch only compares."""
    session = vlmtrace.instrument(
        tracer_provider=TracerProvider(),
        journal=None,
        sample_interval_ms=600_000,
        trim_cache=bound,
        trim_cache_interval_ms=0,
    )
    guard, reading, telemetry = session.cache_guard, session.probe.read().attributes, session.telemetry
    other = best_ns(lambda: guard.on_span_end(sc.STAGE_ENGINE_STREAM, reading), CALLS)
    vision = best_ns(lambda: guard.on_span_end(sc.STAGE_VISION_PREPROCESS, reading), CALLS)
    print(f"   trim_cache={bound}: a span end of another stage {other:.0f} ns, of a vision stage {vision:.0f} ns")
    whole = {True: [], False: []}
    for index in range(ROUNDS):  # alternated, the order swapped every round: the load moves more than the watch costs
        for watched in (True, False) if index % 2 else (False, True):
            telemetry.span_end_watch = guard.on_span_end if watched else None
            whole[watched].append(
                timeit.timeit(lambda: telemetry.start("v", sc.STAGE_VISION_PREPROCESS).end(), number=SPANS)
                / SPANS
                * 1e6
            )
    print(
        f"      a whole vision span, start and end, min / median of {ROUNDS} rounds: "
        f"{min(whole[True]):.1f} / {statistics.median(whole[True]):.1f} us watched, "
        f"{min(whole[False]):.1f} / {statistics.median(whole[False]):.1f} us not"
    )
    vlmtrace.uninstrument()


def wake_latencies(busy: bool, count: int) -> list[float]:
    probe = MemoryProbe()
    arrived = threading.Event()
    times: list[float] = []
    sampler = Sampler(probe, 600_000, [lambda t, a: (times.append(time.perf_counter()), arrived.set())])
    sampler.start()
    latencies = []
    for _ in range(count):
        arrived.clear()
        times.clear()
        woken = time.perf_counter()
        sampler.wake()
        if busy:
            spins = 0
            while not arrived.is_set():
                spins += 1  # pure Python: holds the GIL but for the interpreter's switch interval
        else:
            arrived.wait()
        latencies.append(times[0] - woken)
    sampler.stop()
    probe.close()
    return latencies


def main() -> None:
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    with fake_gpu.two_gpus():
        print(f"1. request path, best of 5 x {CALLS} calls")
        for bound in ("1TiB", "headroom=1GiB"):
            span_end_costs(bound)
        print("2. wake -> the woken sample at the guard (a full reading of two stand-in GPUs), ms median / p90")
        for busy, count in ((False, 500), (True, 100)):
            found = sorted(wake_latencies(busy, count))
            print(
                f"   {'another thread spinning in Python' if busy else 'other threads waiting'}: "
                f"{statistics.median(found) * 1e3:.3f} / {found[int(len(found) * 0.9)] * 1e3:.3f}"
            )


if __name__ == "__main__":
    main()
