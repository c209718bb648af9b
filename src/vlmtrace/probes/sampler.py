"""The background sampler: full memory readings between spans, so a timeline has no holes.

It runs on its own daemon thread and is the only place the expensive readings (NVML's
per-process query, engine scheduler state) are taken, off the request path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from vlmtrace.probes.memory import MemoryProbe

_log = logging.getLogger(__name__)

SampleSink = Callable[[int, Mapping[str, Any]], None]
SampleSource = Callable[[], Mapping[str, Any]]
Upkeep = Callable[[], None]


class Sampler:
    def __init__(
        self, probe: MemoryProbe, interval_ms: int, sinks: list[SampleSink], upkeep: list[Upkeep] | None = None
    ) -> None:
        """`upkeep`: work that belongs off the request path and runs after every sample (the journal's
        `maintain`), so it runs as often as the timeline is sampled, on the sampler's thread."""
        self._probe = probe
        self._interval = interval_ms / 1000
        self._sinks = list(sinks)
        self._upkeep = list(upkeep or ())
        self._sources: dict[str, SampleSource] = {}
        self._every: dict[str, tuple[float, float]] = {}  # name: (seconds between reads, when it is next due)
        self._latest: dict[str, Mapping[str, Any]] = {}
        self._stop = threading.Event()
        self._woken = threading.Event()  # set by stop() too: the thread's wait ends either way
        self._thread: threading.Thread | None = None
        self._failed: set[str] = set()

    def add_source(self, name: str, source: SampleSource, every_s: float | None = None) -> None:
        """Extra readings merged into every sample (e.g. TurboMind's scheduler state); replaced by name.
        `every_s`: merged into one sample in that many seconds only (a reading too large for every sample),
        and into the last (`sample_once(last=True)`)."""
        self._sources[name] = source
        if every_s is None:
            self._every.pop(name, None)
        else:
            self._every[name] = (every_s, 0.0)

    def remove_source(self, name: str) -> None:
        self._sources.pop(name, None)
        self._latest.pop(name, None)
        self._every.pop(name, None)

    def latest(self, name: str) -> Mapping[str, Any]:
        """What a source read at the last sample (read now if sampling is off or it was never read):
        the request path gets engine state without calling into the engine."""
        values = self._latest.get(name)
        if values is None or self._thread is None:
            source = self._sources.get(name)
            values = self._read_source(name, source) if source is not None else {}
        return values

    def _read_source(self, name: str, source: SampleSource) -> Mapping[str, Any]:
        try:
            values = dict(source())
        except Exception as error:  # noqa: BLE001 - an engine that went away must not stop the sampler
            if name not in self._failed:
                self._failed.add(name)
                _log.info("vlmtrace: sample source %s failed: %s", name, error)
            values = {}
        self._latest[name] = values
        return values

    def start(self) -> None:
        """One sample at once (the hot path learns the devices and other processes' use from it), then
        one every interval."""
        if self._thread is not None:
            return
        self.sample_once()
        if self._interval <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="vlmtrace-sampler", daemon=True)
        self._thread.start()

    def sample_once(self, last: bool = False) -> None:
        """`last`: the final sample (at shutdown): every source is read, those of `every_s` too."""
        attributes = dict(self._probe.sample().attributes)
        now = time.monotonic()
        for name, source in list(self._sources.items()):
            every = self._every.get(name)
            if every is not None:
                if now < every[1] and not last:
                    continue
                self._every[name] = (every[0], now + every[0])
            attributes.update(self._read_source(name, source))
        t_ns = time.time_ns()
        for sink in self._sinks:
            sink(t_ns, attributes)
        for step in self._upkeep:
            step()

    def wake(self) -> None:
        """Take the next sample now rather than at the end of the interval (the cache guard, when a
        span end shows its bound crossed); the interval restarts from it. Safe from any thread, and
        cheap (an event set): the sample itself runs on the sampler's thread."""
        self._woken.set()

    def _run(self) -> None:
        while True:
            self._woken.wait(self._interval)
            if self._stop.is_set():
                return
            self._woken.clear()  # before the sample: a wake during it takes one more sample
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - a failing probe ends the sampler with a warning, never the host
                _log.exception("vlmtrace: memory sample failed; the sampler stops")
                return

    def stop(self) -> None:
        self._stop.set()
        self._woken.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
