"""vlmtrace's own spans: recorded on the hot path without the SDK's per-span machinery.

An SDK span (id generation, sampler, attribute validation, locks, processor fan-out) costs ~25 µs
on an H200 host; a tiny-VLM pipeline batch is ~14 ms with ~15 spans, so SDK spans alone would use
the whole 3 % budget. A recorded span keeps what matters where it matters:
- the context it propagates is a real OpenTelemetry `SpanContext`, so other instrumentations parent
  to it and W3C propagation carries it;
- its journal records are queued from the calling thread and written within 10 ms (docs/journal.md);
- a background thread turns ended spans into SDK `ReadableSpan`s and hands them to the provider's
  span processors (OTLP, an in-memory exporter, whatever the application configured).

The SDK's contract still holds: the provider's sampler decides which spans are exported (the journal
records every span: the analyzer needs every request), `suppress_instrumentation()` stops our spans,
the provider's span limits apply to what is exported, and the bridge is itself a span processor on the
provider, first in line, so the provider's `force_flush()` and `shutdown()` empty its queue first.
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
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from vlmtrace import semconv
from vlmtrace.export import sdk_compat
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
    `journaled`: written to the journal (all spans but those started under suppress_instrumentation);
    `recording`: handed to the SDK's processors (the sampler's decision); `sampled`: its trace flag.
    """

    __slots__ = ("name", "kind", "trace_id", "span_id", "parent", "start_ns", "attributes", "links", "recording",
                 "sampled", "journaled", "trace_state", "ids", "memory", "end_memory", "_span_context",
                 "_otel_context")

    def __init__(self, name: str, kind: SpanKind, trace_id: int, span_id: int, parent: SpanContext | None,
                 start_ns: int, attributes: dict[str, Any], links: tuple | list[SpanContext], recording: bool,
                 trace_hex: str | None = None, memory: Mapping[str, Any] = _NO_MEMORY, *, sampled: bool = True,
                 journaled: bool = True, trace_state: TraceState | None = None) -> None:
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
        self.sampled = sampled
        self.journaled = journaled
        self.trace_state = trace_state
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
                                             _SAMPLED if self.sampled else _NOT_SAMPLED, self.trace_state)
        return self._span_context

    def context(self) -> Context:
        """An OpenTelemetry context in which this span is current (for children and other instrumentations)."""
        if self._otel_context is None:
            self._otel_context = trace.set_span_in_context(RecordedSpanInContext(self))
        return self._otel_context


class RecordedSpanInContext(NonRecordingSpan):
    """A recorded span as other code sees it in a context, keeping what a child of it inherits: a span of
    ours started under it takes the child's way (no sampler; the parent decides), as it would given the
    span itself. It copies those values instead of referring to the span, which caches its context: a
    reference both ways would be a cycle left to the garbage collector, one per span."""

    def __init__(self, span: RecordedSpan) -> None:
        super().__init__(span.span_context)
        self.inherited = (span.trace_id, span.ids[0], span.recording, span.sampled, span.journaled, span.trace_state)


class SpanRecorder:
    def __init__(self, journal: JournalWriter | None, bridge: ExportBridge | None,
                 sampler: Sampler | None = None) -> None:
        """`sampler`: the provider's; it decides for spans whose parent is not one of ours (children of
        ours follow their parent, as the SDK's default ParentBased sampler would). None: all sampled."""
        self._journal = journal
        self._bridge = bridge
        self._sampler = sampler

    def start(self, name: str, parent: Context | RecordedSpan | None, kind: SpanKind, attributes: dict[str, Any],
              links: list[SpanContext] | None = None, start_ns: int | None = None,
              memory: Mapping[str, Any] = _NO_MEMORY) -> RecordedSpan:
        """`parent`: a span of ours, an explicit context (an empty `Context()` makes a root), or None for
        the current context. `memory`: the reading at the start (see `RecordedSpan`)."""
        links = list(links) if links else _NONE
        if isinstance(parent, RecordedSpan):
            span = RecordedSpan(name, kind, parent.trace_id, random.getrandbits(64), parent.span_context,
                                start_ns or time.time_ns(), attributes, links, parent.recording, parent.ids[0],
                                memory, sampled=parent.sampled, journaled=parent.journaled,
                                trace_state=parent.trace_state)
        else:
            current = trace.get_current_span(parent)
            if type(current) is RecordedSpanInContext and is_instrumentation_enabled():
                trace_id, trace_hex, recording, sampled, journaled, trace_state = current.inherited
                span = RecordedSpan(name, kind, trace_id, random.getrandbits(64), current.get_span_context(),
                                    start_ns or time.time_ns(), attributes, links, recording, trace_hex, memory,
                                    sampled=sampled, journaled=journaled, trace_state=trace_state)
            else:
                span = self._start_under(name, parent, current, kind, attributes, links, start_ns or time.time_ns(),
                                         memory)
        if span.journaled and self._journal is not None:
            trace_hex, span_hex, parent_hex = span.ids
            thread = getattr(_this_thread, "name", None)
            if thread is None:
                thread = _this_thread.name = threading.current_thread().name
            self._journal.write_span_start(records.start_record(
                span.start_ns, trace_hex, span_hex, parent_hex, name, _KIND_NAMES[id(kind)], thread,
                attributes, memory, records.hex_links(span.links)))
        return span

    def _start_under(self, name: str, parent: Context | None, current: trace.Span, kind: SpanKind,
                     attributes: dict[str, Any], links: tuple | list[SpanContext], start_ns: int,
                     memory: Mapping[str, Any]) -> RecordedSpan:
        """A span whose parent is not ours (a remote or foreign span, or none; `current`: the span current in
        `parent`): the sampler decides. Also any span started inside suppress_instrumentation(): not journaled."""
        parent_context = current.get_span_context()
        if parent_context.is_valid:
            trace_id, parent_span, trace_state = parent_context.trace_id, parent_context, parent_context.trace_state
            sampled = recording = parent_context.trace_flags.sampled
        else:
            trace_id, parent_span, trace_state = random.getrandbits(128), None, None
            sampled = recording = True
        if not is_instrumentation_enabled():  # inside suppress_instrumentation(): no span of ours at all
            return RecordedSpan(name, kind, trace_id, random.getrandbits(64), parent_span, start_ns, attributes,
                                links, False, None, memory, sampled=False, journaled=False, trace_state=trace_state)
        if self._sampler is not None:
            result = self._sampler.should_sample(parent, trace_id, name, kind, attributes,
                                                 [Link(c) for c in links] if links else None)
            recording, sampled = result.decision.is_recording(), result.decision.is_sampled()
            trace_state = result.trace_state if result.trace_state is not None else trace_state
            if result.attributes:
                attributes.update(result.attributes)
        return RecordedSpan(name, kind, trace_id, random.getrandbits(64), parent_span, start_ns, attributes, links,
                            recording, None, memory, sampled=sampled, trace_state=trace_state)

    def end(self, span: RecordedSpan, status: Status | None = None, events: list[Event] | None = None) -> None:
        if not span.journaled:
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
        if span.recording and self._bridge is not None:
            self._bridge.submit((span, end_ns, status, events))


def exception_event(error: BaseException) -> Event:
    """The OpenTelemetry `exception` event (semantic conventions), built only on the error path."""
    return Event("exception", {
        "exception.type": type(error).__qualname__,
        "exception.message": str(error),
        "exception.stacktrace": "".join(traceback.format_exception(error)),
    })


class ExportBridge(SpanProcessor):
    """Ended spans → SDK `ReadableSpan`s → the provider's span processors, on a thread of its own.

    The bridge is also a span processor on that provider, registered first: the provider's
    `force_flush()` and `shutdown()` reach it before the others, and it empties its queue into them
    from the calling thread, so a flush right after a call delivers every span vlmtrace has ended.
    The queue is bounded: when the processors cannot keep up, spans are dropped and counted
    (`on_dropped` gets the running total), never buffered without limit.
    """

    BATCH = 256
    INTERVAL_S = 0.2

    def __init__(self, provider: Any, processor: SpanProcessor, version: str, max_queue: int,
                 shutdown_timeout_s: float, on_dropped: Callable[[int], None] | None = None) -> None:
        """`processor`: the provider's fan-out to all its processors (this one included: it ignores spans)."""
        self._provider = provider
        self._processor = processor
        self._resource = getattr(provider, "resource", None) or Resource.get_empty()
        self._limits: SpanLimits = sdk_compat.span_limits(provider)
        self._scope = InstrumentationScope(semconv.INSTRUMENTATION_SCOPE, version)
        self._max_queue = max_queue
        self._shutdown_timeout_s = shutdown_timeout_s
        self._on_dropped = on_dropped
        self._queue: collections.deque = collections.deque()
        self._dropped = 0
        self._wake = threading.Event()
        # One drainer at a time: spans reach the processors in the order they ended, and a flush that
        # finds the thread handing a span over waits until it has.
        self._draining = threading.Lock()
        self.first = True  # registered before the provider's other processors (see bridge_for)
        self._flushing_others = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="vlmtrace-export", daemon=True)
        self._thread.start()

    def submit(self, item: tuple) -> None:
        if len(self._queue) >= self._max_queue or self._stopped:
            self._count_dropped(1)
            return
        self._queue.append(item)
        if len(self._queue) >= self.BATCH:
            self._wake.set()

    def _count_dropped(self, count: int) -> None:
        self._dropped += count
        if self._on_dropped is not None:
            self._on_dropped(self._dropped)

    def _readable(self, item: tuple) -> ReadableSpan:
        """The span as the SDK would have exported it, within the provider's span limits."""
        span, end_ns, status, events = item
        limits = self._limits
        attributes: Any = {**semconv.span_memory_attributes(span.memory, span.end_memory), **span.attributes}
        most = limits.max_span_attributes  # None: no limit (SpanLimits.UNSET)
        if (most is not None and len(attributes) > most) or limits.max_span_attribute_length is not None:
            attributes = BoundedAttributes(most, attributes, immutable=True,
                                           max_value_len=limits.max_span_attribute_length)
        if events:
            events = BoundedList.from_seq(limits.max_events, [
                Event(e.name, BoundedAttributes(limits.max_event_attributes, e.attributes, immutable=True,
                                                max_value_len=limits.max_attribute_length), e.timestamp,
                      limit=limits.max_event_attributes)
                for e in events])
        links = BoundedList.from_seq(limits.max_links, [Link(c) for c in span.links]) if span.links else ()
        return ReadableSpan(
            name=span.name, context=span.span_context, parent=span.parent, resource=self._resource,
            attributes=attributes, events=events or (), links=links, kind=span.kind, status=status,
            start_time=span.start_ns, end_time=end_ns, instrumentation_scope=self._scope)

    def _drain(self, deadline: float) -> bool:
        """Hand every queued span to the processors, until `deadline` (monotonic); True when the queue is empty."""
        if not self._draining.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            while self._queue and time.monotonic() < deadline:
                item = self._queue.popleft()
                try:
                    self._processor.on_end(self._readable(item))
                except Exception:  # noqa: BLE001 - a failing processor must not stop the export
                    _log.debug("vlmtrace: span processor failed", exc_info=True)
        finally:
            self._draining.release()
        return not self._queue

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.INTERVAL_S)
            self._wake.clear()
            self._drain(time.monotonic() + self.INTERVAL_S)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand every span ended so far to the processors (at most `timeout_millis`); the provider's
        force_flush, which called this first, then flushes them.

        Only where the bridge could not go first does it flush the others itself: those registered
        before it were flushed before these spans reached them.
        """
        deadline = time.monotonic() + timeout_millis / 1000
        if not self._drain(deadline):
            return False
        if self.first or self._flushing_others:  # the others' flush, called from ours below
            return True
        self._flushing_others = True
        try:
            return self._processor.force_flush(max(0, int((deadline - time.monotonic()) * 1000)))
        finally:
            self._flushing_others = False

    def shutdown(self, deadline: float | None = None) -> None:
        """Hand the queued spans over until `deadline` (monotonic; default: the shutdown timeout from now;
        the rest are counted as dropped), stop the thread and leave the provider. Idempotent."""
        if self._stopped:
            return
        if deadline is None:
            deadline = time.monotonic() + self._shutdown_timeout_s
        self._drain(deadline)
        self._stopped = True
        self._wake.set()
        left = len(self._queue)
        self._queue.clear()
        if left:
            self._count_dropped(left)
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        sdk_compat.remove_span_processors(self._provider, (self,))


def _exporting_processors(provider: Any) -> list[SpanProcessor] | None:
    """The provider's span processors other than the journal's (which records our spans itself); None: unknown."""
    processors = sdk_compat.span_processors(provider)
    if processors is None:
        return None
    return [p for p in processors if not isinstance(p, (JournalSpanProcessor, ExportBridge))]


def bridge_for(provider: Any, version: str, max_queue: int, shutdown_timeout_s: float,
               on_dropped: Callable[[int], None] | None) -> ExportBridge | None:
    """A bridge to the provider's processors, registered first on it; None when nothing but the journal
    would receive spans, or the provider is not an SDK one."""
    if _exporting_processors(provider) == []:
        return None
    processor = sdk_compat.fan_out(provider, semconv.INSTRUMENTATION_SCOPE)
    if processor is None:
        return None
    bridge = ExportBridge(provider, processor, version, max_queue, shutdown_timeout_s, on_dropped)
    bridge.first = sdk_compat.add_span_processor_first(provider, bridge)
    return bridge
