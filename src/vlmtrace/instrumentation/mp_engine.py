"""The PyTorch engine in a process of its own (the api_server's `enable_mp_engine`): the request's
context crosses the process boundary with the request.

The server process talks to the engine process through `MPEngineInstance.async_stream_infer(session_id,
**kwargs)`, whose keyword arguments are pickled over ZMQ (or Ray) and arrive at
`EngineWorkerBase.instance_async_stream_infer(**kwargs)` in the engine process. vlmtrace adds the request's
context to those keyword arguments on the way out, as the configured propagators write it (W3C
`traceparent`, `tracestate` and `baggage` by default; `OTEL_PROPAGATORS`), and takes it off on the way
in, before LMDeploy sees them (an engine process without vlmtrace passes it on to
`EngineInstance.async_stream_infer`, which ignores unknown keywords). In the engine process the request
gets a `lmdeploy.pytorch.stream` span, child of the request span, in whose context (baggage included)
the engine's stream runs; the engine steps link to the request span itself, as in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import argument
from vlmtrace.instrumentation.runtime import Telemetry, relay, safe

CONTEXT_KWARG = "vlmtrace_context"


def send_context(telemetry: Telemetry) -> Callable[..., Any]:
    """`MPEngineInstance.async_stream_infer(session_id, *args, **kwargs)` in the server process: returns the
    RPC's async generator unchanged, with the request's context among its keyword arguments."""

    def wrapper(wrapped, instance, args, kwargs):
        session_id = argument(args, kwargs, 0, "session_id")
        request_span = telemetry.request_span_context(session_id)
        # The current context (the caller's baggage, its span) with the request span, where known, as the parent.
        context = None
        if request_span is not None:
            context = trace.set_span_in_context(NonRecordingSpan(request_span), otel_context.get_current())
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=context)
        if carrier:
            kwargs[CONTEXT_KWARG] = carrier
        return wrapped(*args, **kwargs)

    return wrapper


class _StreamCount:
    """What a request's engine stream sent back: chunks, tokens, and the last output (its status)."""

    __slots__ = ("chunks", "last", "tokens")

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


def receive_context(telemetry: Telemetry) -> Callable[..., Any]:
    """`EngineWorkerBase.instance_async_stream_infer(*args, **kwargs)` in the engine process."""

    def wrapper(wrapped, instance, args, kwargs):
        carrier = kwargs.pop(CONTEXT_KWARG, None)
        outputs = wrapped(*args, **kwargs)
        if not isinstance(carrier, dict):
            return outputs
        received = propagate.extract(carrier)
        parent = trace.get_current_span(received).get_span_context()
        if not parent.is_valid:
            return outputs
        session_id = kwargs.get("session_id")
        input_ids = kwargs.get("input_ids")
        attributes: dict[str, Any] = {}
        if isinstance(session_id, int):
            attributes[sc.LMDEPLOY_SESSION_ID] = session_id
        if input_ids is not None and hasattr(input_ids, "__len__"):
            attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = len(input_ids)
        telemetry.remote_requests.put(session_id, parent)
        handle = telemetry.start(sc.SPAN_PYTORCH_STREAM, sc.STAGE_ENGINE_STREAM, attributes, context=received)
        count = _StreamCount()

        def closed(error: BaseException | None) -> None:
            if telemetry.remote_requests.get(session_id) is parent:
                telemetry.remote_requests.pop(session_id)
            handle.end(safe(count.attributes), error=error)

        return relay(
            outputs, count.saw, closed, trace.set_span_in_context(NonRecordingSpan(handle.span_context), received)
        )

    return wrapper
