"""Two GPUs for a machine that has none: a stand-in `pynvml` module and torch allocator counters.

Only the driver calls are replaced; vlmtrace's probes, sampler and everything after them run as on
a GPU host. The numbers are fixed so tests can check where each one ends up.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator

from vlmtrace.probes.torch_allocator import TorchAllocatorProbe, TorchReading

GIB = 1 << 30
UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000")
MODEL = "NVIDIA H200"
TOTAL = (80 * GIB, 80 * GIB)
USED = (30 * GIB, 12 * GIB)
PROCESS = (20 * GIB, 9 * GIB)  # this process's share of USED
TORCH = (TorchReading(5 * GIB, 7 * GIB, 1 * GIB, 2, 0), TorchReading(3 * GIB, 4 * GIB, 0, 0, 0))


class NVMLError(Exception):
    pass


def _pynvml() -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: len(UUIDS)
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetUUID = lambda handle: UUIDS[handle]
    module.nvmlSystemGetDriverVersion = lambda: "999.99"
    module.nvmlDeviceGetName = lambda handle: MODEL
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=USED[handle], total=TOTAL[handle])
    module.nvmlDeviceGetComputeRunningProcesses = lambda handle: [
        types.SimpleNamespace(pid=1, usedGpuMemory=USED[handle] - PROCESS[handle]),
        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=PROCESS[handle]),
    ]
    return module


@contextlib.contextmanager
def two_gpus() -> Iterator[None]:
    """NVML sees two GPUs; torch has CUDA up on both, with the allocator counters of TORCH."""
    saved_module = sys.modules.get("pynvml")
    saved = {name: TorchAllocatorProbe.__dict__[name] for name in ("active", "read", "device_uuids")}
    sys.modules["pynvml"] = _pynvml()
    TorchAllocatorProbe.active = lambda self: True
    TorchAllocatorProbe.read = lambda self, ordinal: TORCH[ordinal]
    TorchAllocatorProbe.device_uuids = lambda self: list(UUIDS)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(TorchAllocatorProbe, name, value)
        if saved_module is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved_module
