"""Other instrumentations' SDK spans into the journal, through the same record builders as vlmtrace's own."""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind, StatusCode

from vlmtrace import semconv
from vlmtrace.export import sdk_compat
from vlmtrace.export.journal import records
from vlmtrace.export.journal.writer import JournalWriter

_KIND_NAMES = {kind: kind.name for kind in SpanKind}
_STATUS_NAMES = {code: code.name for code in StatusCode}
_NO_MEMORY: dict[str, Any] = {}  # SDK spans carry their memory readings (if any) in their attributes


def _links(span: ReadableSpan) -> Any:
    links = sdk_compat.span_links(span)
    return records.hex_links([link.context for link in links] if links else None)


class JournalSpanProcessor(SpanProcessor):
    """Writes a `start` record when a span starts and an `end` record when it ends, from the calling thread.

    The start record is what makes a span that never ends (the process died inside it) visible.
    vlmtrace's own spans are journaled by its recorder, not here.
    """

    def __init__(self, writer: JournalWriter) -> None:
        self._writer = writer

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        scope = span.instrumentation_scope
        if scope is not None and scope.name == semconv.INSTRUMENTATION_SCOPE:
            return  # vlmtrace's own spans are journaled by its recorder
        start_time = span.start_time
        if start_time is None:  # the SDK sets it before on_start: a record without a time is lost
            self._writer.note_lost_record()
            return
        try:
            context, parent = span.context, span.parent
            self._writer.write_span_start(
                records.start_record(
                    start_time,
                    "%032x" % context.trace_id,
                    "%016x" % context.span_id,
                    None if parent is None else "%016x" % parent.span_id,
                    span.name,
                    _KIND_NAMES[span.kind],
                    threading.current_thread().name,
                    sdk_compat.span_attributes(span),
                    _NO_MEMORY,
                    _links(span),
                )
            )
        except Exception:  # noqa: BLE001 - never let tracing break the traced call
            self._writer.note_lost_record()

    def on_end(self, span: ReadableSpan) -> None:
        scope = span.instrumentation_scope
        if scope is not None and scope.name == semconv.INSTRUMENTATION_SCOPE:
            return  # vlmtrace's own spans were journaled by the recorder as they started and ended
        start_time, end_time = span.start_time, span.end_time
        if start_time is None or end_time is None:  # the SDK sets both before on_end
            self._writer.note_lost_record()
            return
        try:
            context, parent, status = span.context, span.parent, span.status
            self._writer.write_span_end(
                records.end_record(
                    end_time,
                    start_time,
                    "%032x" % context.trace_id,
                    "%016x" % context.span_id,
                    None if parent is None else "%016x" % parent.span_id,
                    span.name,
                    _KIND_NAMES[span.kind],
                    _STATUS_NAMES[status.status_code],
                    status.description,
                    sdk_compat.span_attributes(span),
                    _NO_MEMORY,
                    None,
                    records.event_list(sdk_compat.span_events(span)),
                    _links(span),
                )
            )
        except Exception:  # noqa: BLE001 - never let tracing break the traced call
            self._writer.note_lost_record()

    def shutdown(self) -> None:
        self._writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._writer.flush(timeout_millis / 1000)
