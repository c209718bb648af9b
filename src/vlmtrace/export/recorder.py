"""vlmtrace's own spans: journaled on the hot path, exported as the SDK's own spans only where something records.

Every span of vlmtrace is written to the journal (vlmtrace's own sink, beside the OpenTelemetry API)
at its start and end, whether or not an SDK is configured and whatever its sampler decides: the
analyzer needs every request. What reaches OpenTelemetry depends on the tracer vlmtrace was given
(`trace.get_tracer(...)`: the provider passed to `instrument()`, else the global one, through the API's
proxy, so a provider the application sets later is used from then on):

- no SDK (the API's no-op tracer): no OpenTelemetry span object is created. The ids are vlmtrace's,
  and the context a span propagates is a non-recording span built only when someone asks for it
  (a child in another layer, W3C propagation);
- an SDK: each span is started with `tracer.start_span`, so the provider's sampler, span limits,
  id generator and processors (`on_start` and `on_end`) apply as to any instrumentation's spans, and
  the SDK span is the current span inside the wrapped call, where the application's own
  `set_attribute`/`add_event` land on it. The journal records carry that span's ids.

Inside `suppress_instrumentation()` vlmtrace starts no span at all, as contrib's instrumentations.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import opentelemetry.trace as trace_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import (
    Link,
    NoOpTracer,
    ProxyTracer,
    ProxyTracerProvider,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
)

import vlmtrace
from vlmtrace import semconv
from vlmtrace.export.journal import JournalWriter, records
from vlmtrace.export.recorded_span import NO_MEMORY, RecordedSpan, RecordedSpanInContext, SpanEvent

# Keyed by id(): hashing an Enum member, or reading its `.value`, runs Python code (~0.5 µs each).
_KIND_NAMES = {id(kind): kind.name for kind in SpanKind}
_STATUS_NAMES = {id(code): code.name for code in StatusCode}
_UNSET = Status(StatusCode.UNSET)
_this_thread = threading.local()


# Fewer containers per span: each one the garbage collector tracks brings its next collection
# closer (measured on the H200 as collections per batch in benchmarks/gpu_overhead.py).
_NONE: tuple = ()


class SpanRecorder:
    def __init__(self, journal: JournalWriter | None, tracer: Tracer | None = None) -> None:
        """`tracer`: where spans go beside the journal (`trace.get_tracer(...)`); None: the journal only."""
        self._journal = journal
        self._tracer = tracer

    def exporting_tracer(self) -> Tracer | None:
        """The tracer that records spans, or None while there is none (the API's no-op tracer: no SDK).

        In place of the API's proxy tracer, vlmtrace's tracer from the global provider once the application
        sets one (`global_tracer`), used directly from then on."""
        tracer = self._tracer
        if type(tracer) is ProxyTracer:
            tracer = global_tracer()
            if tracer is None:
                return None
            self._tracer = tracer
        return None if tracer is None or type(tracer) is NoOpTracer else tracer

    def start(
        self,
        name: str,
        parent: Context | RecordedSpan | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: Sequence[SpanContext] | None = None,
        start_ns: int | None = None,
        memory: Mapping[str, Any] = NO_MEMORY,
    ) -> RecordedSpan:
        """`parent`: a span of ours, an explicit context (an empty `Context()` makes a root), or None for
        the current context. `memory`: the reading at the start (see `RecordedSpan`)."""
        span_links = list(links) if links else _NONE
        start_ns = start_ns or time.time_ns()
        tracer = self._tracer
        if type(tracer) is ProxyTracer and trace_api._TRACER_PROVIDER is None:
            tracer = None  # no global provider set (yet): the journal only, in one global's read (global_tracer)
        elif tracer is not None:
            tracer = self.exporting_tracer()
        if tracer is not None:
            span = self._start_exported(tracer, name, parent, kind, attributes, span_links, start_ns, memory)
        elif isinstance(parent, RecordedSpan):
            span = RecordedSpan(
                name,
                kind,
                parent.trace_id,
                random.getrandbits(64),
                parent.span_context,
                start_ns,
                attributes,
                span_links,
                memory,
                sampled=parent.sampled,
                journaled=parent.journaled,
                trace_state=parent.trace_state,
            )
        else:
            current = trace.get_current_span(parent)
            if type(current) is RecordedSpanInContext and is_instrumentation_enabled():
                trace_id, sampled, journaled, trace_state = current.inherited
                span = RecordedSpan(
                    name,
                    kind,
                    trace_id,
                    random.getrandbits(64),
                    current.get_span_context(),
                    start_ns,
                    attributes,
                    span_links,
                    memory,
                    sampled=sampled,
                    journaled=journaled,
                    trace_state=trace_state,
                )
            else:
                span = self._start_under(name, current, kind, attributes, span_links, start_ns, memory)
        if span.journaled and self._journal is not None:
            thread = getattr(_this_thread, "name", None)
            if thread is None:
                thread = _this_thread.name = threading.current_thread().name
            # The record's fields as they are now (the attributes and links copied: the span goes on changing
            # its own); the journal's thread builds the record and writes the ids in hex.
            self._journal.write_span_start(
                (
                    records.start_from_ids,
                    span.start_ns,
                    span.trace_id,
                    span.span_id,
                    span.parent_id,
                    name,
                    _KIND_NAMES[id(kind)],
                    thread,
                    dict(attributes),
                    memory,
                    tuple(span.links),
                )
            )
        return span

    @staticmethod
    def _start_under(
        name: str,
        current: trace.Span,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: tuple | list[SpanContext],
        start_ns: int,
        memory: Mapping[str, Any],
    ) -> RecordedSpan:
        """A journal-only span whose parent is not ours (a remote or foreign span, or none; `current`: the span
        current in the parent context); one started inside suppress_instrumentation() is not journaled."""
        parent_context = current.get_span_context()
        if parent_context.is_valid:
            trace_id, parent_span, trace_state = parent_context.trace_id, parent_context, parent_context.trace_state
            sampled = parent_context.trace_flags.sampled
        else:
            trace_id, parent_span, trace_state, sampled = random.getrandbits(128), None, None, True
        return RecordedSpan(
            name,
            kind,
            trace_id,
            random.getrandbits(64),
            parent_span,
            start_ns,
            attributes,
            links,
            memory,
            sampled=sampled,
            journaled=is_instrumentation_enabled(),
            trace_state=trace_state,
        )

    @staticmethod
    def _start_exported(
        tracer: Tracer,
        name: str,
        parent: Context | RecordedSpan | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: tuple | list[SpanContext],
        start_ns: int,
        memory: Mapping[str, Any],
    ) -> RecordedSpan:
        """The SDK's span (its sampler, limits and processors' on_start), journaled under its ids."""
        parent_span: SpanContext | None
        context: Context | None
        if isinstance(parent, RecordedSpan):
            parent_span, context, journaled = parent.span_context, parent.context(), parent.journaled
        else:
            found = trace.get_current_span(parent).get_span_context()
            parent_span, context = (found if found.is_valid else None), parent
            journaled = is_instrumentation_enabled()
        if not journaled:  # inside suppress_instrumentation(): no span of ours at all
            trace_id = parent_span.trace_id if parent_span is not None else random.getrandbits(128)
            return RecordedSpan(
                name,
                kind,
                trace_id,
                random.getrandbits(64),
                parent_span,
                start_ns,
                attributes,
                links,
                memory,
                sampled=False,
                journaled=False,
            )
        otel = tracer.start_span(name, context, kind, attributes, [Link(c) for c in links] if links else None, start_ns)
        ids = otel.get_span_context()
        return RecordedSpan(
            name,
            kind,
            ids.trace_id,
            ids.span_id,
            parent_span,
            start_ns,
            attributes,
            links,
            memory,
            sampled=ids.trace_flags.sampled,
            trace_state=ids.trace_state,
            otel=otel,
        )

    def end(self, span: RecordedSpan, status: Status | None = None, events: list[SpanEvent] | None = None) -> None:
        if not span.journaled:
            return
        end_ns = time.time_ns()
        status = status or _UNSET
        if self._journal is not None:  # built and encoded by the journal's thread (see `start`)
            self._journal.write_span_end(
                (
                    records.end_from_ids,
                    end_ns,
                    span.start_ns,
                    span.trace_id,
                    span.span_id,
                    span.parent_id,
                    span.name,
                    _KIND_NAMES[id(span.kind)],
                    _STATUS_NAMES[id(status.status_code)],
                    status.description,
                    span.attributes,
                    span.end_memory,
                    None if span.memory is span.end_memory else span.memory,
                    events or _NONE,
                    span.links,
                )
            )
        otel = span.otel
        if otel is not None and otel.is_recording():
            otel.set_attributes(
                {**semconv.span_memory_attributes(span.memory, span.end_memory), **records.resolved(span.attributes)}
            )
            if status is not _UNSET:
                otel.set_status(status)
            for event in events or _NONE:
                otel.add_event(event.name, event.attributes, event.timestamp)
            otel.end(end_ns)


def global_tracer() -> Tracer | None:
    """vlmtrace's tracer from the global provider, through the public API; None while none is set.

    `SpanRecorder.start` tells whether one is set at every span by reading the API's own global,
    `opentelemetry.trace._TRACER_PROVIDER` (~0.1 µs; the public `get_tracer_provider()` costs ~3 µs while
    none is set, a KeyError raised and caught in its environment lookup). tests/export/test_tracing.py pins
    what that global holds, on the newest API too (scripts/test-newest-sdk)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):
        return None
    return provider.get_tracer(semconv.INSTRUMENTATION_SCOPE, vlmtrace.__version__, schema_url=semconv.SCHEMA_URL)


def exception_event(error: BaseException) -> SpanEvent:
    """The OpenTelemetry `exception` event (semantic conventions), built only on the error path."""
    return SpanEvent(
        "exception",
        {
            "exception.type": semconv.error_type(error),
            "exception.message": str(error),
            "exception.stacktrace": "".join(traceback.format_exception(error)),
        },
        time.time_ns(),
    )
