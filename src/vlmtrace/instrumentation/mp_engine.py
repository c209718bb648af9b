"""The PyTorch engine in a process of its own (the api_server's `enable_mp_engine`): the request's
context crosses the process boundary with the request.

The server process talks to the engine process through `MPEngineInstance.async_stream_infer(session_id,
**kwargs)`, whose keyword arguments are pickled over ZMQ (or Ray) and arrive at
`EngineWorkerBase.instance_async_stream_infer(**kwargs)` in the engine process. vlmtrace adds the request
span's W3C `traceparent` to those keyword arguments on the way out and takes it off on the way in, before
LMDeploy sees them (an engine process without vlmtrace passes it on to `EngineInstance.async_stream_infer`,
which ignores unknown keywords). In the engine process the request gets a `lmdeploy.pytorch.stream` span,
child of the request span, and the engine steps link to the request span itself, as in one process.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import argument
from vlmtrace.instrumentation.runtime import Telemetry, relay, safe

TRACEPARENT_KWARG = "vlmtrace_traceparent"


def format_traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(text: Any) -> SpanContext | None:
    """A remote SpanContext from `00-<trace id>-<span id>-<flags>`, or None for anything else."""
    if not isinstance(text, str):
        return None
    parts = text.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if parts[0] == "ff" or not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


def send_context(telemetry: Telemetry):
    """`MPEngineInstance.async_stream_infer(session_id, *args, **kwargs)` in the server process: returns the
    RPC's async generator unchanged, with the request span's traceparent among its keyword arguments."""

    def wrapper(wrapped, instance, args, kwargs):
        session_id = argument(args, kwargs, 0, "session_id")
        context = telemetry.request_span_context(session_id)
        if context is None:
            context = trace.get_current_span().get_span_context()
        if context.is_valid:
            kwargs[TRACEPARENT_KWARG] = format_traceparent(context)
        return wrapped(*args, **kwargs)

    return wrapper


class _StreamCount:
    """What a request's engine stream sent back: chunks, tokens, and the last output (its status)."""

    __slots__ = ("chunks", "tokens", "last")

    def __init__(self) -> None:
        self.chunks = self.tokens = 0
        self.last: Any = None

    def saw(self, output: Any) -> None:
        self.chunks += 1
        self.tokens += len(getattr(output, "token_ids", None) or ())
        self.last = output

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {sc.ENGINE_OUTPUT_CHUNKS: self.chunks, sc.GEN_AI_USAGE_OUTPUT_TOKENS: self.tokens}
        status = getattr(self.last, "status", None)
        if status is not None:
            attributes[sc.ENGINE_STATUS] = getattr(status, "name", str(status))
        return attributes


def receive_context(telemetry: Telemetry):
    """`EngineWorkerBase.instance_async_stream_infer(*args, **kwargs)` in the engine process."""

    def wrapper(wrapped, instance, args, kwargs):
        parent = parse_traceparent(kwargs.pop(TRACEPARENT_KWARG, None))
        outputs = wrapped(*args, **kwargs)
        if parent is None:
            return outputs
        session_id = kwargs.get("session_id")
        input_ids = kwargs.get("input_ids")
        attributes: dict[str, Any] = {}
        if isinstance(session_id, int):
            attributes[sc.LMDEPLOY_SESSION_ID] = session_id
        if input_ids is not None and hasattr(input_ids, "__len__"):
            attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = len(input_ids)
        telemetry.remote_requests.put(session_id, parent)
        handle = telemetry.start(sc.SPAN_PYTORCH_STREAM, sc.STAGE_ENGINE_STREAM, attributes,
                                 context=trace.set_span_in_context(trace.NonRecordingSpan(parent)))
        count = _StreamCount()

        def closed(error: BaseException | None) -> None:
            if telemetry.remote_requests.get(session_id) is parent:
                telemetry.remote_requests.pop(session_id)
            handle.end(safe(count.attributes), error=error)

        return relay(outputs, count.saw, closed)

    return wrapper
