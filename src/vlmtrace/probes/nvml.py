"""Device and per-process GPU memory from NVML (nvidia-ml-py), which sees every allocator.

NVML is the only reading that includes TurboMind's own pool, cuBLAS/NCCL workspaces and the CUDA
context. It is read by the background sampler only (see probes/memory.py for why).
"""

from __future__ import annotations

import contextlib
import os


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised; the message says why, for the log and `doctor`."""


def _visible_selectors() -> list[str] | None:
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    return [part.strip() for part in text.split(",") if part.strip()]


class NvmlProbe:
    def __init__(self, indices: tuple[int, ...] | None = None) -> None:
        try:
            import pynvml
        except ImportError as error:
            raise NvmlUnavailable("nvidia-ml-py is not installed (pip install 'vlmtrace[gpu]')") from error
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlUnavailable(f"NVML did not initialise: {error}") from error
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        all_handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.uuids = [self._uuid(h) for h in all_handles]
        if indices is None:
            indices = self._visible_indices(count)
        self.indices: tuple[int, ...] = tuple(i for i in indices if 0 <= i < count)
        self._handles = {i: all_handles[i] for i in self.indices}
        self.driver_version = self._text(pynvml.nvmlSystemGetDriverVersion())
        # Each probed GPU's model name ("NVIDIA H200"), for the hw.* attributes of the hw.gpu.* metrics.
        self.models = {i: self._text(pynvml.nvmlDeviceGetName(self._handles[i])) for i in self.indices}

    @staticmethod
    def _text(value: bytes | str) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _uuid(self, handle: object) -> str:
        return self._text(self._nvml.nvmlDeviceGetUUID(handle))

    def _visible_indices(self, count: int) -> tuple[int, ...]:
        """NVML numbers every GPU on the host; CUDA_VISIBLE_DEVICES says which ones this process sees."""
        selectors = _visible_selectors()
        if selectors is None:
            return tuple(range(count))
        chosen: list[int] = []
        for selector in selectors:
            if selector.isdigit():
                chosen.append(int(selector))
                continue
            matches = [i for i, uuid in enumerate(self.uuids) if uuid.startswith(selector)]
            if not matches:
                break
            chosen.append(matches[0])
        return tuple(chosen)

    def device_memory(self, index: int) -> tuple[int, int]:
        """(used, total) bytes on the device, all processes together."""
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handles[index])
        return int(info.used), int(info.total)

    def process_memory(self, index: int, pid: int) -> int | None:
        """Bytes this pid holds on the device; None when NVML hides it (PID namespaces, MIG)."""
        for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[index]):
            if process.pid == pid:
                used = process.usedGpuMemory
                return int(used) if used is not None else None
        return 0

    def shutdown(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
