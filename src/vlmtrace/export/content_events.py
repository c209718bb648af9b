"""The GenAI content event: a request's prompt and response as one `gen_ai.client.inference.operation.details`
log record, through the OpenTelemetry Logs API, where the capture mode asks for events (`capture_content`
`EVENT_ONLY` or `SPAN_AND_EVENT`; docs/schema.md, "Content events").

As vlmtrace's spans go through the tracing API, its events go through the Logs API only: to the
`logger_provider` passed to `instrument()`, or else the global one (the application's,
`opentelemetry-instrument`'s), through the API's proxy, so a provider set later gets them from then on.
Without an SDK LoggerProvider the API's no-op logger drops them. An event carries the request span's GenAI
attributes (`gen_ai.*`, `error.type`) and the prompt and response as structured values, in the request
span's context (its trace and span ids). Nothing here is built unless events are asked for.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry._logs import LogRecord, get_logger

import vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.export.recorded_span import RecordedSpan

_GEN_AI = "gen_ai."
_CONTENT_KEYS = (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES)


def event_attributes(
    span_attributes: Mapping[str, Any],
    input_messages: list[dict[str, Any]] | None,
    output_messages: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The event's attributes: the span's GenAI ones and `error.type`, its content as structured values
    (on a span the conventions give them as JSON text; on an event, as they are)."""
    attributes = {
        key: value
        for key, value in span_attributes.items()
        if (key.startswith(_GEN_AI) and key not in _CONTENT_KEYS) or key == sc.ERROR_TYPE
    }
    if input_messages:
        attributes[sc.GEN_AI_INPUT_MESSAGES] = input_messages
    if output_messages:
        attributes[sc.GEN_AI_OUTPUT_MESSAGES] = output_messages
    return attributes


class ContentEvents:
    """The logger vlmtrace's GenAI events go to (its instrumentation scope and schema URL, as its tracer's)."""

    def __init__(self, logger_provider: Any = None) -> None:
        """`logger_provider`: the one passed to `instrument()`; None: the global one (also one set later)."""
        self._logger = get_logger(
            sc.INSTRUMENTATION_SCOPE, vlmtrace.__version__, logger_provider, schema_url=sc.SCHEMA_URL
        )

    def emit(
        self,
        span: RecordedSpan,
        input_messages: list[dict[str, Any]] | None,
        output_messages: list[dict[str, Any]] | None,
    ) -> None:
        """One event for a request whose span `span` has ended."""
        self._logger.emit(
            LogRecord(
                timestamp=time.time_ns(),
                context=span.context(),
                event_name=sc.EVENT_INFERENCE_DETAILS,
                attributes=event_attributes(span.attributes, input_messages, output_messages),
            )
        )
