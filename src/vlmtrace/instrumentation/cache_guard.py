"""The cache guard (`trim_cache`): torch's cached-but-unused memory released when a bound is crossed,
from the background sampler's thread, so that no request waits for the decision or the release.

It lives in the instrumentation layer, not in probes: the probes only measure, while the guard acts
on the process (it calls into torch's allocator) and records what it did as a span through the
session's Telemetry, as the wrappers do. It decides from the sampler's full readings (NVML included)
as one of the sampler's sinks, after the journal has written the sample that triggered it.

Besides every sample, the guard looks at the end reading of every vision-stage span (torch's
counters are read live there anyway): a vision tower's temporaries are freed into torch's cache when
its stage ends, so that is when the cache crosses a bound, and the time until the next request's
vision stage is the time to release it. The request path only compares numbers; on a crossing it
wakes the sampler, whose full reading decides and trims, as on any sample.

Trims are rate-limited (`trim_cache_interval_ms`, 5 s by default): the requests right after a trim
get their memory from CUDA again and are slower, so a bound that the workload's working set keeps
crossing costs one slow request per interval instead of one per request; 0 trims at every crossing,
which bounds the cache's peak. docs/cache-guard.md says when to use it and what it cannot fix.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import suppress_instrumentation

from vlmtrace import semconv as sc
from vlmtrace.config import CACHED, CacheBound
from vlmtrace.instrumentation.runtime import Telemetry, warn_once

_log = logging.getLogger(__name__)

# With a headroom bound, a device whose torch cache holds less than this is not trimmed: releasing it
# would give other allocators next to nothing, and every trim slows the requests after it.
MIN_RELEASABLE_BYTES = 32 * 1024 * 1024

# The stages whose end can leave torch's cache over the bound: a torch vision tower's temporaries
# (beside TurboMind, or the PyTorch engine's ViT) are freed into the cache as the stage ends.
WATCHED_STAGES = frozenset(
    {sc.STAGE_VISION_PREPROCESS, sc.STAGE_VISION_INFER, sc.STAGE_VISION_BATCH, sc.STAGE_VISION_FORWARD}
)

Release = Callable[[int], None]


def release_torch_cache(ordinal: int) -> None:
    """torch.cuda.empty_cache() in the device context of `ordinal`.

    The sampler's thread has never chosen a device: a CUDA call there would run on device 0 and, in a
    process that does not use device 0, create a CUDA context on it (hundreds of MiB). The device
    synchronisation first waits for in-flight work with the GIL released; empty_cache's cudaFree
    would otherwise wait for it while holding torch's allocator lock (and, in older torch releases, the GIL),
    stalling the request path's allocations for that long."""
    import torch

    with torch.cuda.device(ordinal):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@dataclasses.dataclass(frozen=True)
class Crossing:
    """A device whose reading crossed the bound: its NVML index and what was read."""

    device: int
    cached: int
    free: int | None


def _per_device(attributes: Mapping[str, Any], key: str, count: int) -> tuple | None:
    values = attributes.get(key + sc.PER_DEVICE_SUFFIX)
    if values is not None:
        return tuple(values)
    value = attributes.get(key)
    return (value,) if value is not None and count == 1 else None


def find_crossing(attributes: Mapping[str, Any], bound: CacheBound) -> Crossing | None:
    """The first device of a full reading that crosses `bound`; None when none does, or when torch's
    allocator was not read (torch without CUDA, or TurboMind alone: there is nothing to trim)."""
    devices = attributes.get(sc.MEM_DEVICES) or ()
    allocated = _per_device(attributes, sc.MEM_TORCH_ALLOCATED, len(devices))
    reserved = _per_device(attributes, sc.MEM_TORCH_RESERVED, len(devices))
    if not devices or allocated is None or reserved is None:
        return None
    used = _per_device(attributes, sc.MEM_GPU_USED, len(devices))
    total = _per_device(attributes, sc.MEM_GPU_TOTAL, len(devices))
    for position, device in enumerate(devices):
        cached = reserved[position] - allocated[position]
        free = total[position] - used[position] if used is not None and total is not None else None
        if bound.kind == CACHED:
            crossed = cached > bound.limit_bytes
        else:
            crossed = free is not None and free < bound.limit_bytes and cached >= MIN_RELEASABLE_BYTES
        if crossed:
            return Crossing(device, cached, free)
    return None


class Shortage(NamedTuple):
    """Per device of a full reading, torch's reserved bytes at which the device's free memory falls
    under the headroom bound if torch alone grows from there (NVML's used grows by what torch
    reserves); and the lowest of them."""

    reserved: tuple[int, ...]
    lowest: int


def reserved_at_shortage(attributes: Mapping[str, Any], limit_bytes: int) -> Shortage | None:
    """None without torch's and NVML's readings."""
    devices = attributes.get(sc.MEM_DEVICES) or ()
    reserved = _per_device(attributes, sc.MEM_TORCH_RESERVED, len(devices))
    used = _per_device(attributes, sc.MEM_GPU_USED, len(devices))
    total = _per_device(attributes, sc.MEM_GPU_TOTAL, len(devices))
    if not devices or reserved is None or used is None or total is None:
        return None
    thresholds = tuple(t - u + r - limit_bytes for t, u, r in zip(total, used, reserved, strict=False))
    return Shortage(thresholds, min(thresholds))


def short_of_headroom(reading: Mapping[str, Any], shortage: Shortage) -> bool:
    """Whether a quick reading (torch's live counters) shows a device past its shortage with enough
    cached to be worth a trim."""
    if reading.get(sc.MEM_TORCH_RESERVED, 0) <= shortage.lowest:  # no device reserves more than all of them
        return False
    count = len(shortage.reserved)
    reserved = _per_device(reading, sc.MEM_TORCH_RESERVED, count)
    allocated = _per_device(reading, sc.MEM_TORCH_ALLOCATED, count)
    if reserved is None or allocated is None or len(reserved) != count:
        return False
    return any(
        r > limit and r - a >= MIN_RELEASABLE_BYTES
        for r, a, limit in zip(reserved, allocated, shortage.reserved, strict=False)
    )


class CacheGuard:
    """A sampler sink: trims when a sample crosses the bound, at most once per interval; and a
    watcher of vision-stage ends that wakes the sampler when one crosses it."""

    def __init__(
        self, telemetry: Telemetry, bound: CacheBound, interval_ms: int, release: Release | None = None
    ) -> None:
        """`release`: what frees a device's torch cache, given its CUDA ordinal; `release_torch_cache`
        unless given (tests on a machine without CUDA stand in for it: the torch boundary)."""
        self._telemetry = telemetry
        self._bound = bound
        self._interval_ns = interval_ms * 1_000_000
        self._release = release if release is not None else release_torch_cache
        self._last_trim_ns: int | None = None
        self._failed = False
        self._wake: Callable[[], None] | None = None
        self._shortage: Shortage | None = None  # headroom: the last sample's
        self.trims = 0
        self.released_bytes = 0
        self.wakes = 0  # vision-stage ends that crossed the bound and woke the sampler
        if bound.kind != CACHED and telemetry.probe.status.get("nvml") != "ok":
            warn_once(
                "cache-guard-nvml",
                "trim_cache=%s needs NVML's free memory, which is not read (%s); the cache guard will not trim",
                bound,
                telemetry.probe.status.get("nvml", "off"),
                logger=_log,
            )

    def watch_stage_ends(self, wake: Callable[[], None]) -> None:
        """From now on, a vision-stage span whose end reading crosses the bound calls `wake` (the
        sampler's: its next sample, taken at once, decides and trims)."""
        self._wake = wake
        self._telemetry.span_end_watch = self.on_span_end

    def on_span_end(self, stage: str | None, reading: Mapping[str, Any]) -> None:
        """On the request path: a few comparisons, and an event set when the bound is crossed."""
        if stage not in WATCHED_STAGES or self._failed or self._wake is None:
            return
        if self._bound.kind == CACHED:
            # Every device's cache is at most their sum: under the bound, it takes two lookups to know.
            cached = reading.get(sc.MEM_TORCH_RESERVED, 0) - reading.get(sc.MEM_TORCH_ALLOCATED, 0)
            if cached <= self._bound.limit_bytes:
                return
        if self._resting(time.time_ns()):
            return
        try:
            if self._bound.kind == CACHED:
                crossed = find_crossing(reading, self._bound) is not None
            else:  # the reading's NVML numbers are the last sample's: estimate free memory from torch's growth
                shortage = self._shortage
                crossed = shortage is not None and short_of_headroom(reading, shortage)
        except Exception:  # noqa: BLE001 - not the request's failure; the sampler's full reading decides anyway
            return
        if crossed:
            self.wakes += 1
            self._wake()

    def _resting(self, t_ns: int) -> bool:
        """Within the interval after the last trim. Times are wall-clock: after a backward jump,
        trim rather than wait out the jump."""
        return self._last_trim_ns is not None and 0 <= t_ns - self._last_trim_ns < self._interval_ns

    def on_sample(self, t_ns: int, attributes: Mapping[str, Any]) -> None:
        if self._failed:
            return
        try:
            if self._bound.kind != CACHED:
                self._shortage = reserved_at_shortage(attributes, self._bound.limit_bytes)
            if self._resting(t_ns):
                return
            crossing = find_crossing(attributes, self._bound)
            ordinal = self._telemetry.probe.torch_ordinals().get(crossing.device) if crossing is not None else None
        except Exception as exc:  # noqa: BLE001 - an error of the guard's must not stop the sampler it runs in
            self._stop("reading the sample", exc)
            return
        if crossing is None or ordinal is None:
            return
        self._last_trim_ns = t_ns
        self._trim(crossing, ordinal, attributes)

    def _stop(self, doing: str, error: Exception) -> None:
        self._failed = True
        warn_once(
            f"cache-guard:{doing}",
            "the cache guard stops: %s failed (%s: %s)",
            doing,
            type(error).__name__,
            error,
            logger=_log,
        )

    def _trim(self, crossing: Crossing, ordinal: int, trigger: Mapping[str, Any]) -> None:
        probe = self._telemetry.probe
        attributes: dict[str, Any] = {
            sc.CACHE_TRIM_BOUND: self._bound.kind,
            sc.CACHE_TRIM_LIMIT: self._bound.limit_bytes,
            sc.CACHE_TRIM_DEVICE: crossing.device,
            sc.CACHE_TRIM_CACHED: crossing.cached,
        }
        if crossing.free is not None:
            attributes[sc.CACHE_TRIM_FREE] = crossing.free
        if sc.MEM_READ_TIME in trigger:
            attributes[sc.CACHE_TRIM_TRIGGER_TIME] = trigger[sc.MEM_READ_TIME]
        # Full readings on both sides: the span's reserved delta is what the trim released, and the
        # NVML reading after it is fresh, so spans that follow do not pair torch's new reserved with
        # the process memory of before the trim (their `native` would jump by what was released).
        before = probe.sample()
        handle = self._telemetry.start(
            sc.SPAN_CACHE_TRIM, sc.STAGE_CACHE_TRIM, attributes, context=Context(), start_reading=before
        )
        error = None
        try:
            with suppress_instrumentation():  # not the application's own torch.cuda.empty_cache span
                self._release(ordinal)
        except Exception as exc:  # noqa: BLE001 - the guard must never take the service down: it stops instead
            error = exc
            self._stop("trimming torch's cache", exc)
        after = probe.sample()
        released = before.attributes.get(sc.MEM_TORCH_RESERVED, 0) - after.attributes.get(sc.MEM_TORCH_RESERVED, 0)
        handle.end({sc.CACHE_TRIM_RELEASED: released}, error=error)
        self.trims += 1
        self.released_bytes += max(released, 0)
