"""A span of vlmtrace's between its start and end records, and how other code sees it in a context."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


NO_MEMORY: Mapping[str, Any] = {}  # shared by spans read without memory: never changed


class SpanEvent(NamedTuple):
    """A span event as the journal and `Span.add_event` take it."""

    name: str
    attributes: Mapping[str, Any]
    timestamp: int


class RecordedSpan:
    """A span between its start and end records; mutable only by the code that started it.

    Its ids are plain ints (the journal's thread writes them in hex). Without an SDK the OpenTelemetry `SpanContext` and `Context`
    objects are built only when someone asks (a child in another layer, a link); with one, `otel` is the
    SDK's span, which the context carries. `journaled`: written to the journal (all spans but those
    started under suppress_instrumentation); `sampled`: its trace flag.
    """

    __slots__ = (
        "_otel_context",
        "_span_context",
        "attributes",
        "end_memory",
        "journaled",
        "kind",
        "links",
        "memory",
        "name",
        "otel",
        "parent",
        "parent_id",
        "sampled",
        "span_id",
        "start_ns",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        kind: SpanKind,
        trace_id: int,
        span_id: int,
        parent: SpanContext | None,
        start_ns: int,
        attributes: dict[str, Any],
        links: tuple | list[SpanContext],
        memory: Mapping[str, Any] = NO_MEMORY,
        *,
        sampled: bool = True,
        journaled: bool = True,
        trace_state: TraceState | None = None,
        otel: trace.Span | None = None,
    ) -> None:
        """`memory`: the memory reading at the start (a shared mapping, never changed); `end_memory` the
        one at the end. They stay apart from `attributes` until the span is handed to the SDK at its end
        (`span_memory_attributes`): the journal encodes both as they are, in C. `otel`: the SDK's span."""
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.start_ns = start_ns
        self.attributes = attributes
        self.links = links
        self.otel = otel
        self.sampled = sampled
        self.journaled = journaled
        self.trace_state = trace_state
        self.parent_id = parent.span_id if parent is not None else None
        self.memory = memory
        self.end_memory = memory
        self._span_context: SpanContext | None = otel.get_span_context() if otel is not None else None
        self._otel_context: Context | None = None

    @property
    def span_context(self) -> SpanContext:
        if self._span_context is None:
            self._span_context = SpanContext(
                self.trace_id, self.span_id, False, _SAMPLED if self.sampled else _NOT_SAMPLED, self.trace_state
            )
        return self._span_context

    def context(self) -> Context:
        """An OpenTelemetry context in which this span is current (for children and other instrumentations)."""
        if self._otel_context is None:
            self._otel_context = trace.set_span_in_context(
                self.otel if self.otel is not None else RecordedSpanInContext(self)
            )
        return self._otel_context

    def add_link(self, span_context: SpanContext) -> None:
        if isinstance(self.links, list):
            self.links.append(span_context)
        else:
            self.links = [span_context]
        if self.otel is not None:
            self.otel.add_link(span_context)


class RecordedSpanInContext(NonRecordingSpan):
    """A journal-only span as other code sees it in a context, keeping what a child of it inherits. It
    copies those values instead of referring to the span, which caches its context: a reference both
    ways would be a cycle left to the garbage collector, one per span."""

    def __init__(self, span: RecordedSpan) -> None:
        super().__init__(span.span_context)
        self.inherited = (span.trace_id, span.sampled, span.journaled, span.trace_state)
