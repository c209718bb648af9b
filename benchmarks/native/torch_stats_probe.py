"""What the compiled read of torch's allocator counters costs against torch's statistics dict (issue 14).

    python3 benchmarks/native/torch_stats_probe.py [--calls 20000]

Builds (or loads) vlmtrace's compiled read as a session would (probes/native_counters.py: the system's
C++ compiler, the installed torch's headers, the nvidia-* wheels' CUDA headers), which checks its five
counters against `torch._C._cuda_memoryStats`; then checks them again 50 times while tensors come and
go, and times both reads. Prints one JSON object. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vlmtrace.probes.native_counters import NativeCounters


def python_read() -> tuple[int, ...]:
    stats = torch._C._cuda_memoryStats(0)
    return (stats["allocated_bytes"]["all"]["current"], stats["reserved_bytes"]["all"]["current"],
            stats["inactive_split_bytes"]["all"]["current"], stats["num_alloc_retries"], stats["num_ooms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.empty(1, device="cuda")  # CUDA up, as in a served process
    native = NativeCounters(torch)
    started = time.perf_counter()
    native.start()
    while native.state == "building":
        time.sleep(0.01)
    report: dict = {"torch": torch.__version__, "state": native.state, "ready_s": round(time.perf_counter() - started, 2)}
    if native.state == "ready":
        kept, agree = [], 0
        for step in range(50):
            kept.append(torch.empty((step + 1) * 1_000_003, dtype=torch.uint8, device="cuda"))
            if step % 3 == 0:
                kept.pop(0)
            agree += python_read() == native.read(0)
        report["agree_of_50"] = agree
        for name, read in (("python_nested_dict", python_read), ("compiled", lambda: native.read(0))):
            begin = time.perf_counter_ns()
            for _ in range(args.calls):
                read()
            report[f"{name}_us"] = round((time.perf_counter_ns() - begin) / args.calls / 1000, 3)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
