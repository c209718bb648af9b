"""Torch caching-allocator counters, read without ever initialising CUDA.

`torch.cuda.memory_allocated()` flattens the whole statistics dict in Python on every call
(67 µs on an H200 host); the nested dict straight from C++ holds the same counters, so one call
per device gives all five readings. Cheaper still, once built: a compiled read of the five alone
(native_counters.py).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

from vlmtrace.probes.native_counters import NativeCounters


class TorchReading(NamedTuple):
    allocated: int
    reserved: int
    inactive_split: int
    alloc_retries: int
    ooms: int


def _current(stats: dict, key: str) -> int:
    return int(stats[key]["all"]["current"])


class TorchAllocatorProbe:
    """Reads torch's allocator only once the application itself has brought CUDA up."""

    def __init__(self, native: bool = False) -> None:
        """`native`: build and use the compiled read once CUDA is up (native_counters.py)."""
        self._torch = None
        self._nested_stats = None
        self._want_native = native
        self.native: NativeCounters | None = None

    def _bind(self) -> bool:
        if self._torch is None:
            torch = sys.modules.get("torch")
            if torch is None or not hasattr(torch, "cuda"):
                return False
            self._torch = torch
            self._nested_stats = getattr(torch._C, "_cuda_memoryStats", None)
        return True

    def active(self) -> bool:
        """True when torch is imported and has initialised CUDA in this process."""
        active = self._bind() and bool(self._torch.cuda.is_initialized())
        if active and self._want_native and self.native is None and self._nested_stats is not None:
            self.native = NativeCounters(self._torch, self.read_from_torch)
            self.native.start()
        return active

    @property
    def native_state(self) -> str:
        return self.native.state if self.native is not None else ("off" if not self._want_native else "not started")

    def device_count(self) -> int:
        return int(self._torch.cuda.device_count()) if self.active() else 0

    def read(self, ordinal: int) -> TorchReading:
        counters = self.native.read(ordinal) if self.native is not None else None
        return TorchReading(*counters) if counters is not None else self.read_from_torch(ordinal)

    def read_from_torch(self, ordinal: int) -> TorchReading:
        """Through torch's own statistics dict (what the compiled read is checked against)."""
        if self._nested_stats is not None:
            stats = self._nested_stats(ordinal)
            return TorchReading(
                _current(stats, "allocated_bytes"),
                _current(stats, "reserved_bytes"),
                _current(stats, "inactive_split_bytes"),
                int(stats["num_alloc_retries"]),
                int(stats["num_ooms"]),
            )
        flat = self._torch.cuda.memory_stats(ordinal)
        return TorchReading(
            int(flat.get("allocated_bytes.all.current", 0)),
            int(flat.get("reserved_bytes.all.current", 0)),
            int(flat.get("inactive_split_bytes.all.current", 0)),
            int(flat.get("num_alloc_retries", 0)),
            int(flat.get("num_ooms", 0)),
        )

    def device_uuids(self) -> list[str | None]:
        """UUIDs of the CUDA ordinals, to match them with NVML's indices (CUDA is up by then)."""
        uuids: list[str | None] = []
        for ordinal in range(self.device_count()):
            try:
                uuid = str(self._torch.cuda.get_device_properties(ordinal).uuid)
            except (AttributeError, RuntimeError):
                uuid = None
            uuids.append(uuid if uuid is None or uuid.startswith("GPU-") else f"GPU-{uuid}")
        return uuids

    def version(self) -> str | None:
        torch = sys.modules.get("torch")
        return getattr(torch, "__version__", None) if torch is not None else None
