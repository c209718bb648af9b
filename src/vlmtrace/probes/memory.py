"""One memory reading for a span boundary or a background sample, in the schema's attribute keys.

The hot path (span start/end) takes a *quick* reading: torch's allocator counters, live (one C++
call per device, and only while the allocator holds memory), and the host's resident memory (a pread
of /proc/self/statm holding the GIL), and reuses a reading younger than `probe_reuse_us` (nested
spans start and end within microseconds of each other). Host memory is read there because a leak in
one stage of a request is otherwise seen only by the 100 ms sampler, where every stage of several
requests ran: the stage could not be named (docs/analysis.md, "Where"). The NVML readings of a span
are those of the latest background sample: measured inside a TurboMind pipeline on an H200 host, an
NVML device query that costs 5 µs alone took ~70 µs on the request path (driver locks shared with
the engine's own CUDA calls). The background sampler takes *full* readings: torch, NVML device and
per-process use, host RSS.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from vlmtrace import semconv as sc
from vlmtrace.probes.heap import StageTags, in_use_reader, stage_tags
from vlmtrace.probes.host import HostMemoryProbe
from vlmtrace.probes.nvml import NvmlProbe, NvmlUnavailable
from vlmtrace.probes.torch_allocator import TorchAllocatorProbe, TorchReading

_log = logging.getLogger(__name__)


class Reading(NamedTuple):
    monotonic_ns: int
    attributes: dict[str, Any]


class MemoryProbe:
    """Never raises into the caller: a probe that fails is switched off and the reason logged once."""

    def __init__(
        self,
        probes: tuple[str, ...] = ("torch", "nvml", "host"),
        devices: tuple[int, ...] | None = None,
        reuse_us: int = 200,
        nvml: Callable[[tuple[int, ...] | None], NvmlProbe] = NvmlProbe,
        host_at_boundaries: bool = True,
        native_counters: bool = False,
    ) -> None:
        """`nvml`: what opens NVML (tests of several GPUs on a machine with none pass a stand-in).
        `host_at_boundaries`: read host memory in quick readings too (off: only the sampler reads it;
        benchmarks/gpu_ablation.py measures what it costs). `native_counters`: read torch's counters
        through the compiled read once it is built (native_counters.py)."""
        self._reuse_ns = reuse_us * 1000
        self._last: Reading | None = None
        self.status: dict[str, str] = {}
        self._torch = TorchAllocatorProbe(native_counters) if "torch" in probes else None
        self._host = self._start("host", HostMemoryProbe) if "host" in probes else None
        self._host_at_boundaries = host_at_boundaries
        # Read wherever RSS is, in a process started with the heap counter preloaded (probes/heap.py).
        self._heap = in_use_reader() if self._host is not None else None
        self._stage_tags = stage_tags() if self._heap is not None else None
        self._nvml = self._start("nvml", lambda: nvml(devices)) if "nvml" in probes else None
        if self._torch is None:
            self.status["torch"] = "off (VLMTRACE_PROBES)"
        # NVML index -> torch ordinal, known once torch has CUDA up
        self._ordinals: dict[int, int] | None = None
        # While torch's allocator holds nothing (TurboMind 0.18), quick readings reuse the sampled
        # counters instead of paying ~20 µs per device for a dict of zeros.
        self._torch_idle = False
        self._sampled_torch: dict[int, TorchReading] = {}
        self._sampled_gpu: dict[int, dict[str, int]] = {}
        self._sampled_rss: int | None = None
        self._sampled: Reading | None = None
        self._torch_live = False
        self.reads = 0
        self.measurements = 0
        self._hot_devices: tuple[int, ...] = self._nvml.indices if self._nvml else ()

    def _start(self, name: str, factory: Callable[[], Any]) -> Any:
        try:
            probe = factory()
        except (NvmlUnavailable, OSError, ImportError) as error:
            self._disable(name, str(error))
            return None
        self.status[name] = "ok"
        return probe

    def _disable(self, name: str, reason: str) -> None:
        self.status[name] = f"unavailable: {reason}"
        level = logging.WARNING if name != "nvml" or os.path.exists("/proc/driver/nvidia") else logging.INFO
        _log.log(level, "vlmtrace: %s readings are off: %s", name, reason)

    @property
    def torch_allocator(self) -> TorchAllocatorProbe | None:
        """Torch's probe (benchmarks/ patch or wait on its compiled read); None with torch's readings off."""
        return self._torch

    @property
    def nvml_driver_version(self) -> str | None:
        return self._nvml.driver_version if self._nvml else None

    def _torch_active(self) -> bool:
        if self._torch is None:
            return False
        active = self._torch.active()
        if active and "torch" not in self.status:
            self.status["torch"] = "ok"
        return active

    def _ordinal_map(self) -> dict[int, int]:
        """Match CUDA ordinals to NVML indices by UUID: CUDA's default order need not be NVML's."""
        if self._ordinals is None:
            uuids = self._torch.device_uuids() if self._torch is not None else []
            if self._nvml is None:
                self._ordinals = {ordinal: ordinal for ordinal in range(len(uuids))}
            else:
                by_uuid = {uuid: index for index, uuid in enumerate(self._nvml.uuids)}
                visible = self._nvml.indices
                self._ordinals = {}
                for ordinal, uuid in enumerate(uuids):
                    index = by_uuid.get(uuid) if uuid else None
                    if index is None and ordinal < len(visible):
                        index = visible[ordinal]
                    if index is not None:
                        self._ordinals[index] = ordinal
        return self._ordinals

    def torch_ordinals(self) -> dict[int, int]:
        """NVML index -> CUDA ordinal of each device torch has CUDA up on (empty before it has):
        what acts on torch's allocator for a device (the cache guard) needs its ordinal."""
        return dict(self._ordinal_map()) if self._torch_active() else {}

    @property
    def host_at_boundaries(self) -> bool:
        """Whether span boundaries carry host memory read there (else the latest sample's)."""
        return self._host is not None and self._host_at_boundaries

    @host_at_boundaries.setter
    def host_at_boundaries(self, value: bool) -> None:
        self._host_at_boundaries = value

    def read(self) -> Reading:
        """A quick reading, reused if the last one is younger than the reuse window. While torch's
        allocator is not live (not initialised, or holding nothing), its values and NVML's are the last
        sample's."""
        self.reads += 1
        sampled = self._sampled
        host = self._host if self._host_at_boundaries else None
        if sampled is not None and not self._torch_live and host is None:
            return sampled
        now = time.perf_counter_ns()
        last = self._last
        if last is not None and now - last.monotonic_ns < self._reuse_ns:
            return last
        self.measurements += 1
        if sampled is not None and not self._torch_live and host is not None:  # host is set here (else returned above)
            attributes = sampled.attributes.copy()
            attributes[sc.MEM_READ_TIME] = time.time_ns()
            self._read_host(attributes, host.rss_on_request_path)
        else:
            attributes = self._measure(full=False)
        reading = Reading(now, attributes)
        self._last = reading
        return reading

    def _host_rss(self, read: Callable[[], int]) -> int | None:
        """`read()` (one of the host probe's two reads), or None with the host probe switched off."""
        try:
            return read()
        except OSError as error:
            self._disable("host", str(error))
            self._host = None
            return None

    def _read_host(self, attributes: dict[str, Any], read: Callable[[], int]) -> None:
        """RSS by `read` and, where the heap counter is loaded, the heap bytes in use, read now."""
        rss = self._host_rss(read)
        if rss is not None:
            attributes[sc.MEM_HOST_RSS] = rss
            if self._heap is not None:
                attributes[sc.MEM_HOST_HEAP] = self._heap()

    @property
    def stage_tags(self) -> StageTags | None:
        """The heap counter's charges by allocating stage (None: not preloaded); span boundaries set the stage."""
        return self._stage_tags

    @property
    def last(self) -> Reading | None:
        """The newest reading taken, quick or sampled."""
        return self._last

    def sample(self) -> Reading:
        """A full reading for the background sampler; it also refreshes what the hot path derives."""
        reading = Reading(time.perf_counter_ns(), self._measure(full=True))
        self._torch_live = self._torch_active() and not self._torch_idle
        self._last = self._sampled = reading
        return reading

    def _measure(self, full: bool) -> dict[str, Any]:
        attributes: dict[str, Any] = {sc.MEM_READ_TIME: time.time_ns()}
        if self._host is not None:
            if full:  # the sampler's thread may let go of the GIL; a span boundary must not (probes/host.py)
                self._read_host(attributes, self._host.rss)
                self._sampled_rss = attributes.get(sc.MEM_HOST_RSS, self._sampled_rss)
            elif self._host_at_boundaries:
                self._read_host(attributes, self._host.rss_on_request_path)
            if sc.MEM_HOST_RSS not in attributes and self._sampled_rss is not None:
                attributes[sc.MEM_HOST_RSS] = self._sampled_rss
        try:
            self._measure_devices(attributes, full)
        except Exception as error:  # noqa: BLE001 - a driver or allocator error must never reach the application
            self._disable_device_probes(error)
        return attributes

    def _disable_device_probes(self, error: Exception) -> None:
        if self._nvml is not None:
            self._disable("nvml", f"{type(error).__name__}: {error}")
            self._nvml = None
        elif self._torch is not None:
            self._disable("torch", f"{type(error).__name__}: {error}")
            self._torch = None

    def _device_indices(self, torch_on: bool, full: bool) -> tuple[int, ...]:
        if self._nvml is not None:
            return self._nvml.indices if full else self._hot_devices
        return tuple(sorted(self._ordinal_map())) if torch_on else ()

    def _measure_devices(self, attributes: dict[str, Any], full: bool) -> None:
        torch_on = self._torch_active()
        indices = self._device_indices(torch_on, full)
        if not indices:
            return
        ordinals = self._ordinal_map() if torch_on else {}
        columns: dict[str, list] = {}
        used_devices: list[int] = []
        for index in indices:
            values = self._measure_device(index, ordinals.get(index), full)
            if full and self._nvml is not None and not self._in_use(values, index, ordinals):
                continue
            used_devices.append(index)
            for key, value in values.items():
                columns.setdefault(key, []).append(value)
        if full:
            self._torch_idle = bool(self._sampled_torch) and not any(
                reading.reserved for reading in self._sampled_torch.values()
            )
            if self._nvml is not None:
                self._hot_devices = tuple(used_devices) or self._nvml.indices
        if not used_devices:
            return
        attributes[sc.MEM_DEVICES] = tuple(
            used_devices
        )  # tuples of ints: a span's attribute dict stays untracked by the GC
        per_device = len(used_devices) > 1
        for key, column in columns.items():
            if len(column) != len(used_devices):
                continue
            attributes[key] = sum(column)
            if per_device and key in sc.MEM_PER_DEVICE_KEYS:
                attributes[key + sc.PER_DEVICE_SUFFIX] = tuple(column)

    @staticmethod
    def _in_use(values: dict[str, int], index: int, ordinals: dict[int, int]) -> bool:
        return values.get(sc.MEM_GPU_PROCESS, 0) > 0 or index in ordinals

    def _measure_device(self, index: int, ordinal: int | None, full: bool) -> dict[str, int]:
        values: dict[str, int] = {}
        reserved = None
        if ordinal is not None:
            if full or not self._torch_idle or index not in self._sampled_torch:
                torch = self._torch
                assert torch is not None  # an ordinal is known only while torch's probe is on
                torch_reading = torch.read(ordinal)
                if full:
                    self._sampled_torch[index] = torch_reading
            else:
                torch_reading = self._sampled_torch[index]
            reserved = torch_reading.reserved
            values[sc.MEM_TORCH_ALLOCATED] = torch_reading.allocated
            values[sc.MEM_TORCH_RESERVED] = reserved
            values[sc.MEM_TORCH_INACTIVE_SPLIT] = torch_reading.inactive_split
            values[sc.MEM_TORCH_ALLOC_RETRIES] = torch_reading.alloc_retries
            values[sc.MEM_TORCH_OOMS] = torch_reading.ooms
        if self._nvml is None:
            return values
        if not full:
            sampled = self._sampled_gpu.get(index)
            if sampled is not None:
                values.update(sampled)
            return values
        used, total = self._nvml.device_memory(index)
        gpu = {sc.MEM_GPU_USED: used, sc.MEM_GPU_TOTAL: total}
        process = self._nvml.process_memory(index, os.getpid())
        if process is not None:
            gpu[sc.MEM_GPU_PROCESS] = process
            gpu[sc.MEM_NATIVE] = process - reserved if reserved is not None else process
        self._sampled_gpu[index] = gpu
        values.update(gpu)
        return values

    def gpu_hardware(self) -> dict[int, dict[str, str]]:
        """The semantic conventions' hw.* attributes of each probed GPU, by NVML index; empty without NVML."""
        if self._nvml is None:
            return {}
        return {
            index: {
                sc.HW_VENDOR: "NVIDIA",
                sc.HW_MODEL: model,
                sc.HW_NAME: f"{model} (gpu{index})",
                sc.HW_DRIVER_VERSION: self._nvml.driver_version,
            }
            for index, model in self._nvml.models.items()
        }

    def versions(self) -> dict[str, str]:
        found = {"python": sys.version.split()[0]}
        torch_version = self._torch.version() if self._torch else None
        if torch_version:
            found["torch"] = torch_version
        if self._nvml is not None:
            found["nvml_driver"] = self._nvml.driver_version
        return found

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
        if self._nvml is not None:
            self._nvml.shutdown()
