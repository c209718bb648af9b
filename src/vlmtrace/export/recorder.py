"""vlmtrace's own spans: recorded on the hot path without the SDK's per-span machinery.

An SDK span (id generation, sampler, attribute validation, locks, processor fan-out) costs ~25 µs
on an H200 host; a tiny-VLM pipeline batch is ~14 ms with ~15 spans, so SDK spans alone would use
the whole 3 % budget. A recorded span keeps what matters where it matters:
- the context it propagates is a real OpenTelemetry `SpanContext`, so other instrumentations parent
  to it and W3C propagation carries it;
- its journal records are queued from the calling thread and written within 10 ms (docs/journal.md);
- a background thread turns ended spans into SDK `ReadableSpan`s and hands them to the provider's
  span processors (OTLP, an in-memory exporter, whatever the application configured).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from vlmtrace import semconv
from vlmtrace.export.journal import JournalSpanProcessor, JournalWriter, records

_log = logging.getLogger("vlmtrace")

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


# Keyed by id(): hashing an Enum member, or reading its `.value`, runs Python code (~0.5 µs each).
_KIND_NAMES = {id(kind): kind.name for kind in SpanKind}
_STATUS_NAMES = {id(code): code.name for code in StatusCode}
_UNSET = Status(StatusCode.UNSET)
_this_thread = threading.local()


# Fewer containers per span: each one the garbage collector tracks brings its next collection
# closer (measured on the H200 as collections per batch in benchmarks/gpu_overhead.py).
_NONE: tuple = ()
_NO_MEMORY: dict[str, Any] = {}  # shared by spans read without memory: never changed


class RecordedSpan:
    """A span between its start and end records; mutable only by the code that started it.

    Its ids are plain ints and hex strings; the OpenTelemetry `SpanContext` and `Context` objects
    are built only when someone asks (a child in another layer, a link, the export thread).
    """

    __slots__ = ("name", "kind", "trace_id", "span_id", "parent", "start_ns", "attributes", "links", "recording",
                 "ids", "memory", "end_memory", "_span_context", "_otel_context")

    def __init__(self, name: str, kind: SpanKind, trace_id: int, span_id: int, parent: SpanContext | None,
                 start_ns: int, attributes: dict[str, Any], links: tuple | list[SpanContext], recording: bool,
                 trace_hex: str | None = None, memory: Mapping[str, Any] = _NO_MEMORY) -> None:
        """`trace_hex`: the trace id in hex where the caller has it (a child of one of our spans).
        `memory`: the memory reading at the start (a shared mapping, never changed); `end_memory` the
        one at the end. They stay apart from `attributes` until someone outside the hot path merges
        them (`span_memory_attributes`): the journal encodes both as they are, in C."""
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.start_ns = start_ns
        self.attributes = attributes
        self.links = links
        self.recording = recording
        self.ids = (trace_hex or "%032x" % trace_id, "%016x" % span_id,
                    "%016x" % parent.span_id if parent is not None else None)
        self.memory = memory
        self.end_memory = memory
        self._span_context: SpanContext | None = None
        self._otel_context: Context | None = None

    @property
    def span_context(self) -> SpanContext:
        if self._span_context is None:
            self._span_context = SpanContext(self.trace_id, self.span_id, False,
                                             _SAMPLED if self.recording else _NOT_SAMPLED)
        return self._span_context

    def context(self) -> Context:
        """An OpenTelemetry context in which this span is current (for children and other instrumentations)."""
        if self._otel_context is None:
            self._otel_context = trace.set_span_in_context(NonRecordingSpan(self.span_context))
        return self._otel_context


class SpanRecorder:
    def __init__(self, journal: JournalWriter | None, bridge: ExportBridge | None) -> None:
        self._journal = journal
        self._bridge = bridge

    def start(self, name: str, parent: Context | RecordedSpan | None, kind: SpanKind, attributes: dict[str, Any],
              links: list[SpanContext] | None = None, start_ns: int | None = None,
              memory: Mapping[str, Any] = _NO_MEMORY) -> RecordedSpan:
        """`parent`: a span of ours, an explicit context (an empty `Context()` makes a root), or None for
        the current context. `memory`: the reading at the start (see `RecordedSpan`)."""
        if isinstance(parent, RecordedSpan):
            trace_id = parent.trace_id
            recording = parent.recording
            parent_span = parent.span_context
            trace_hex = parent.ids[0]
        else:
            trace_hex = None
            parent_context = trace.get_current_span(parent).get_span_context()
            if parent_context.is_valid:
                trace_id = parent_context.trace_id
                recording = parent_context.trace_flags.sampled
                parent_span = parent_context
            else:
                trace_id = random.getrandbits(128)
                recording = True
                parent_span = None
        span = RecordedSpan(name, kind, trace_id, random.getrandbits(64), parent_span, start_ns or time.time_ns(),
                            attributes, list(links) if links else _NONE, recording, trace_hex, memory)
        if recording and self._journal is not None:
            trace_hex, span_hex, parent_hex = span.ids
            thread = getattr(_this_thread, "name", None)
            if thread is None:
                thread = _this_thread.name = threading.current_thread().name
            self._journal.write_span_start(records.start_record(
                span.start_ns, trace_hex, span_hex, parent_hex, name, _KIND_NAMES[id(kind)], thread,
                attributes, memory, records.hex_links(span.links)))
        return span

    def end(self, span: RecordedSpan, status: Status | None = None, events: list[Event] | None = None) -> None:
        if not span.recording:
            return
        end_ns = time.time_ns()
        status = status or _UNSET
        if self._journal is not None:
            trace_hex, span_hex, parent_hex = span.ids
            self._journal.write_span_end(records.end_record(
                end_ns, span.start_ns, trace_hex, span_hex, parent_hex, span.name, _KIND_NAMES[id(span.kind)],
                _STATUS_NAMES[id(status.status_code)], status.description, span.attributes, span.end_memory,
                None if span.memory is span.end_memory else span.memory, records.event_list(events),
                records.hex_links(span.links)))
        if self._bridge is not None:
            self._bridge.submit((span, end_ns, status, events))


def exception_event(error: BaseException) -> Event:
    """The OpenTelemetry `exception` event (semantic conventions), built only on the error path."""
    return Event("exception", {
        "exception.type": type(error).__qualname__,
        "exception.message": str(error),
        "exception.stacktrace": "".join(traceback.format_exception(error)),
    })


class ExportBridge:
    """Ended spans → SDK `ReadableSpan`s → the provider's span processors, on a thread of its own.

    The queue is bounded: when the processors cannot keep up, spans are dropped and counted
    (`on_dropped` gets the running total), never buffered without limit.
    """

    BATCH = 256
    INTERVAL_S = 0.2

    def __init__(self, processor: SpanProcessor, resource: Resource, version: str, max_queue: int,
                 on_dropped: Callable[[int], None] | None = None) -> None:
        self._processor = processor
        self._resource = resource
        self._scope = InstrumentationScope(semconv.INSTRUMENTATION_SCOPE, version)
        self._max_queue = max_queue
        self._on_dropped = on_dropped
        self._queue: collections.deque = collections.deque()
        self._dropped = 0
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="vlmtrace-export", daemon=True)
        self._thread.start()

    def submit(self, item: tuple) -> None:
        if len(self._queue) >= self._max_queue or self._stopped:
            self._dropped += 1
            if self._on_dropped is not None:
                self._on_dropped(self._dropped)
            return
        self._queue.append(item)
        if len(self._queue) >= self.BATCH:
            self._wake.set()

    def _readable(self, item: tuple) -> ReadableSpan:
        span, end_ns, status, events = item
        return ReadableSpan(
            name=span.name, context=span.span_context, parent=span.parent, resource=self._resource,
            attributes={**semconv.span_memory_attributes(span.memory, span.end_memory), **span.attributes},
            events=tuple(events or ()), links=tuple(Link(c) for c in span.links),
            kind=span.kind, status=status, start_time=span.start_ns, end_time=end_ns,
            instrumentation_scope=self._scope)

    def _drain(self) -> None:
        with self._idle:
            self._busy = True
        try:
            while self._queue:
                item = self._queue.popleft()
                try:
                    self._processor.on_end(self._readable(item))
                except Exception:  # a failing processor must not stop the export thread
                    _log.debug("vlmtrace: span processor failed", exc_info=True)
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.INTERVAL_S)
            self._wake.clear()
            self._drain()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Hand every span submitted so far to the processors, then flush them."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while (self._queue or self._busy) and time.monotonic() < deadline:
                self._wake.set()
                self._idle.wait(0.01)
        remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
        return not self._queue and self._processor.force_flush(remaining_ms)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=1)


def _exporting_processors(provider: Any) -> list[SpanProcessor]:
    """The SDK provider's span processors other than the journal's (which records our spans itself)."""
    fan_out = getattr(provider, "_active_span_processor", None)
    processors = getattr(fan_out, "_span_processors", None)
    if not isinstance(processors, tuple):
        return [fan_out] if isinstance(fan_out, SpanProcessor) else []
    return [p for p in processors if not isinstance(p, JournalSpanProcessor)]


def bridge_for(provider: Any, version: str, max_queue: int,
               on_dropped: Callable[[int], None] | None) -> ExportBridge | None:
    """A bridge to the provider's processors; None when nothing but the journal would receive spans."""
    if not _exporting_processors(provider):
        return None
    processor = provider._active_span_processor
    resource = getattr(provider, "resource", None) or Resource.get_empty()
    return ExportBridge(processor, resource, version, max_queue, on_dropped)
