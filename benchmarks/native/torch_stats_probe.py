"""What the compiled read of torch's allocator counters costs against torch's statistics dict.

    python3 benchmarks/native/torch_stats_probe.py [--calls 20000]

Builds (or loads) vlmtrace's compiled read as a session's probe does (probes/native_counters.py: the
system's C++ compiler and the installed torch's headers), which checks
its five counters against torch's statistics dict; then checks them again 50 times while tensors come
and go, and times both reads. Prints one JSON object. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vlmtrace.probes.torch_allocator import TorchAllocatorProbe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.empty(1, device="cuda")  # CUDA up, as in a served process
    probe = TorchAllocatorProbe(native=True)
    started = time.perf_counter()
    probe.active()  # what a session's first reading does: starts the build
    probe.native.wait()
    report: dict = {
        "torch": torch.__version__,
        "state": probe.native_state,
        "ready_s": round(time.perf_counter() - started, 2),
    }
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
    print(json.dumps(report))


if __name__ == "__main__":
    main()
