"""When a capture window opens and closes, and the record it leaves in the journal.

The controller is a sink of the background sampler: each sample feeds the live suspicion
(suspicion.py) with the requests completed so far (request spans ended in this process). Where a
component is suspected (`auto`), at once (`now`), or when `vlmtrace capture --pid` leaves its trigger
file in the journal's directory, it opens the window of that component's tool: tracemalloc for host
memory, torch's memory history for tensors and cache. The window closes after `capture_window_requests`
requests, `capture_window_seconds` seconds or `capture_window_bytes` bytes traced, whichever comes first,
and writes a `capture` record (docs/journal.md). `auto` opens at most one window per component every
`capture_every_s` seconds. Outside a window no hook is installed: tracemalloc is stopped and torch
records no history.

Everything here runs on the sampler's thread; a failure closes the window, is one warning, and never
reaches the service.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from vlmtrace import semconv as sc
from vlmtrace.capture.heap_window import HeapWindow
from vlmtrace.capture.sites import Site, StageMap, as_record
from vlmtrace.capture.suspicion import Suspicion
from vlmtrace.capture.torch_window import TorchWindow
from vlmtrace.export.journal import records

_log = logging.getLogger(__name__)

AUTO, OFF, NOW = "auto", "off", "now"
MODES = (AUTO, OFF, NOW)
BY_HAND = "by hand"
TRIGGER_PREFIX = "vlmtrace-capture."  # + pid: the file `vlmtrace capture --pid` leaves in the journal's directory


class Window(Protocol):
    """A capture tool's window (heap_window.py, torch_window.py)."""

    tool: str

    @staticmethod
    def available() -> str | None: ...

    def open(self) -> None: ...

    def traced_bytes(self) -> int: ...

    def close(self, stages: StageMap, snapshot_path: str | None) -> tuple[list[Site], str | None]: ...

    def abandon(self) -> None: ...


# Which tool captures each component's sites; native GPU memory has none.
TOOLS: dict[str, type[Window]] = {"host": HeapWindow, "tensor": TorchWindow, "cache": TorchWindow}


def trigger_path(journal_dir: str, pid: int) -> str:
    return os.path.join(journal_dir, f"{TRIGGER_PREFIX}{pid}")


@dataclasses.dataclass(frozen=True)
class Bounds:
    requests: int
    seconds: float
    bytes: int
    every_s: float  # between two `auto` windows of one component


@dataclasses.dataclass
class _Open:
    window: Window
    components: list[str]
    reason: str
    start_ns: int
    start_s: float
    requests_at_start: int
    rate_at_start: float | None


class CaptureController:
    def __init__(
        self, mode: str, bounds: Bounds, journal: Any, family_targets: Iterable[Any], suspicion: Suspicion | None = None
    ) -> None:
        """`journal`: the JournalWriter the records go to (captures need one: no journal, no capture)."""
        self.mode = mode
        self.bounds = bounds
        self.requests = 0  # request spans ended in this process
        self._journal = journal
        self._dir = os.path.dirname(journal.path) if journal is not None else None
        self._stages = StageMap(family_targets)
        self._suspicion = suspicion if suspicion is not None else Suspicion()
        self._open: dict[type[Window], _Open] = {}
        self._last_opened: dict[str, float] = {}
        self._pending_now = set(TOOLS) if mode == NOW else set()  # opened as soon as their tool can open
        self._warned: set[tuple[str, str]] = set()
        self._windows = 0
        self.enabled = mode != OFF and journal is not None

    @property
    def capturing(self) -> bool:
        """Whether a window is open now."""
        return bool(self._open)

    def growth_suspected(self) -> bool:
        """Whether growth is suspected now: the live suspicion's latest fit found a component growing (`auto`
        only: the other modes do not fit), or a capture window is open. Read on the request path: two
        attribute reads, no fit."""
        return bool(self._suspicion.growing or self._open)

    def watch(self, previous: Any) -> Any:
        """A span-end watch that counts request ends, then calls `previous` (the cache guard's), if any."""
        request = sc.STAGE_REQUEST

        def watch(stage: str | None, memory: Mapping[str, Any]) -> None:
            if stage == request:
                self.requests += 1
            if previous is not None:
                previous(stage, memory)

        return watch

    def on_sample(self, t_ns: int, reading: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            self._step(t_ns, reading)
        except Exception as error:  # noqa: BLE001 - never the service's problem: one warning, the window closed
            self._failed(error)

    def _step(self, t_ns: int, reading: Mapping[str, Any]) -> None:
        now = time.monotonic()
        for kind, state in list(self._open.items()):
            stopped_by = self._stopped_by(state, now)
            if stopped_by is not None:
                self._close(kind, state, stopped_by)
        wanted: list[tuple[str, str]] = []
        for component in list(self._pending_now):
            why_not = TOOLS[component].available()
            if why_not is None:
                self._pending_now.discard(component)
                wanted.append((component, NOW))
            else:
                self._cannot_open(component, why_not)
        if self._triggered():
            wanted += [(component, BY_HAND) for component in TOOLS]
        if self.mode == AUTO:
            for component in self._suspicion.add(self.requests, reading):
                if now - self._last_opened.get(component, -float("inf")) >= self.bounds.every_s:
                    wanted.append((component, AUTO))
        for component, reason in wanted:
            self._open_window(component, reason, t_ns, now)

    def _triggered(self) -> bool:
        if self._dir is None:
            return False
        path = trigger_path(self._dir, os.getpid())
        if not os.path.exists(path):
            return False
        with contextlib.suppress(OSError):
            os.unlink(path)  # taken: `vlmtrace capture` sees the file gone
        return True

    def _open_window(self, component: str, reason: str, t_ns: int, now: float) -> None:
        kind = TOOLS[component]
        state = self._open.get(kind)
        if state is not None:
            if component not in state.components:
                state.components.append(component)
                self._last_opened[component] = now
            return
        why_not = kind.available()
        if why_not is not None:
            self._cannot_open(component, why_not)
            self._last_opened[component] = now  # not asked again until the next period
            return
        window = kind()
        window.open()
        fit = self._suspicion.fit(component)
        self._open[kind] = _Open(window, [component], reason, t_ns, now, self.requests, fit.slope if fit else None)
        self._last_opened[component] = now
        _log.info("vlmtrace: capture window opened for %s (%s, %s)", component, kind.tool, reason)

    def _cannot_open(self, component: str, why_not: str) -> None:
        if (TOOLS[component].tool, why_not) not in self._warned:
            self._warned.add((TOOLS[component].tool, why_not))
            self._journal.warn("vlmtrace.capture", f"no {component} capture window yet: {why_not}")

    def _stopped_by(self, state: _Open, now: float) -> str | None:
        if self.requests - state.requests_at_start >= self.bounds.requests:
            return "requests"
        if now - state.start_s >= self.bounds.seconds:
            return "seconds"
        if state.window.traced_bytes() >= self.bounds.bytes:
            return "bytes"
        return None

    def _close(self, kind: type[Window], state: _Open, stopped_by: str) -> None:
        del self._open[kind]
        self._windows += 1
        snapshot = None
        if kind is TorchWindow and self._dir is not None:
            snapshot = os.path.join(self._dir, f"capture-{os.getpid()}-{self._windows}.pickle")
        requests = self.requests - state.requests_at_start
        try:
            sites, written = state.window.close(self._stages, snapshot)
        except Exception:
            state.window.abandon()
            raise
        for component in state.components:
            self._suspicion.forget(component)  # the window's own memory is no growth of the service's
        self._journal.write_capture(
            records.capture_record(
                start=state.start_ns,
                components=state.components,
                tool=kind.tool,
                reason=state.reason,
                requests=requests,
                seconds=time.monotonic() - state.start_s,
                stopped_by=stopped_by,
                rate_at_start=state.rate_at_start,
                snapshot=written,
                **as_record(sites, requests),
            )
        )
        _log.info(
            "vlmtrace: capture window closed for %s after %d requests (%s)",
            ", ".join(state.components),
            requests,
            stopped_by,
        )

    def close(self) -> None:
        """At the session's end: an open window is closed and recorded with what it saw."""
        for kind, state in list(self._open.items()):
            try:
                self._close(kind, state, "shutdown")
            except Exception as error:  # noqa: BLE001 - as on_sample's
                self._failed(error)

    def _failed(self, error: Exception) -> None:
        for state in self._open.values():
            with contextlib.suppress(Exception):  # the window is left as it is; the warning below says so
                state.window.abandon()
        self._open.clear()
        message = f"capture failed ({type(error).__name__}: {error}); its window was closed"
        _log.warning("vlmtrace: %s", message)
        if self._journal is not None:
            self._journal.warn("vlmtrace.capture", message)
