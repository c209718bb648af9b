"""Torch caching-allocator counters, read without ever initialising CUDA.

`torch.cuda.memory_allocated()` flattens the whole statistics dict in Python on every call
(67 µs on an H200 host); the nested dict straight from C++ holds the same counters, so one call
per device gives all five readings. Cheaper still, once built: a compiled read of the five alone
(native_counters.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
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
        self._torch: ModuleType | None = None  # torch once the application imported it (never imported here)
        self._nested_stats: Callable[[int], dict] | None = None
        self._want_native = native
        self.native: NativeCounters | None = None

    def _bind(self) -> ModuleType | None:
        torch = self._torch
        if torch is None:
            torch = sys.modules.get("torch")
            if torch is None or not hasattr(torch, "cuda"):
                return None
            self._torch = torch
            self._nested_stats = getattr(torch._C, "_cuda_memoryStats", None)
        return torch

    def active(self) -> bool:
        """True when torch is imported and has initialised CUDA in this process."""
        torch = self._bind()
        if torch is None or not torch.cuda.is_initialized():
            return False
        if self._want_native and self.native is None and self._nested_stats is not None:
            self.native = NativeCounters(torch, self.read_from_torch)
            self.native.start()
        return True

    @property
    def native_state(self) -> str:
        return self.native.state if self.native is not None else ("off" if not self._want_native else "not started")

    def device_count(self) -> int:
        torch = self._torch if self.active() else None
        return int(torch.cuda.device_count()) if torch is not None else 0

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
        torch = self._torch
        assert torch is not None  # bound by `active`, which comes first
        flat = torch.cuda.memory_stats(ordinal)
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
        count, torch = self.device_count(), self._torch  # counting binds torch
        if torch is None:
            return uuids
        for ordinal in range(count):
            try:
                uuid: str | None = str(torch.cuda.get_device_properties(ordinal).uuid)
            except (AttributeError, RuntimeError):
                uuid = None
            uuids.append(uuid if uuid is None or uuid.startswith("GPU-") else f"GPU-{uuid}")
        return uuids

    def version(self) -> str | None:
        torch = sys.modules.get("torch")
        return getattr(torch, "__version__", None) if torch is not None else None
