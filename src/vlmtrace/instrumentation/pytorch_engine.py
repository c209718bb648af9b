"""The PyTorch-engine layer: each engine step is a trace of its own.

A step serves many requests at once, so it cannot be a child of any one of them: the
`lmdeploy.pytorch.schedule` span (the inputs maker choosing the batch) links to the request spans
of the sequences in the batch, and the `lmdeploy.pytorch.forward` span (the model agent running
it) is its child. The two run in different asyncio tasks; the agent consumes dispatched batches in
order, so a first-in-first-out queue per agent carries the schedule span to its forward span.
"""

from __future__ import annotations

import collections
import contextvars
import time
import weakref
from typing import Any

from opentelemetry.context import Context
from opentelemetry import context as otel_context

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import MAX_LISTED_ITEMS
from vlmtrace.instrumentation.runtime import SpanHandle, Telemetry, safe
from vlmtrace.probes.memory import Reading

MAX_PENDING_STEPS = 64


class _Dispatch:
    """A step being scheduled: its start, and its span once the batch is handed to the agent."""

    __slots__ = ("start_ns", "start_reading", "handle")

    def __init__(self, start_ns: int, start_reading: Reading) -> None:
        self.start_ns = start_ns
        self.start_reading = start_reading
        self.handle: SpanHandle | None = None


_dispatching: contextvars.ContextVar[_Dispatch | None] = contextvars.ContextVar("vlmtrace_dispatch", default=None)


class StepQueues:
    """Per model agent, the schedule spans dispatched and not yet picked up by a forward."""

    def __init__(self) -> None:
        self._queues: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def queue(self, agent: Any) -> collections.deque:
        queue = self._queues.get(agent)
        if queue is None:
            queue = self._queues[agent] = collections.deque(maxlen=MAX_PENDING_STEPS)
        return queue


def _kind(inputs: Any, delta: Any) -> str:
    if inputs is None:
        return "decode"
    return "decode" if getattr(inputs, "is_decoding", False) else "prefill"


def _batch_attributes(inputs: Any, delta: Any) -> dict[str, Any]:
    source = inputs if inputs is not None else delta
    attributes: dict[str, Any] = {sc.STEP_KIND: _kind(inputs, delta)}
    if source is None:
        return attributes
    seq_length = getattr(source, "seq_length", None)
    if seq_length is not None and hasattr(seq_length, "shape"):
        attributes[sc.STEP_SEQUENCES] = int(seq_length.shape[0])
    input_ids = getattr(inputs, "input_ids", None)
    if input_ids is not None:
        attributes[sc.STEP_TOKENS] = int(input_ids.numel())
    elif sc.STEP_SEQUENCES in attributes:
        attributes[sc.STEP_TOKENS] = attributes[sc.STEP_SEQUENCES]
    kv_tokens = getattr(source, "sum_kv_seqlen", None)
    if kv_tokens is not None:
        attributes[sc.STEP_KV_TOKENS] = int(kv_tokens)
    return attributes


def _running_attributes(running: Any) -> dict[str, Any]:
    sequences = list(running or ())
    session_ids = [int(seq.session_id) for seq in sequences[:MAX_LISTED_ITEMS]]
    attributes: dict[str, Any] = {sc.STEP_SEQUENCES: len(sequences), sc.STEP_SESSION_IDS: session_ids}
    blocks = [len(seq.logical_blocks) for seq in sequences if hasattr(seq, "logical_blocks")]
    if blocks:
        attributes[sc.STEP_KV_BLOCKS] = sum(blocks)
    return attributes


def _open_schedule_span(telemetry: Telemetry, dispatch: _Dispatch, forward_inputs: Any) -> SpanHandle:
    attributes = {}
    if isinstance(forward_inputs, dict):
        attributes = safe(_batch_attributes, forward_inputs.get("inputs"), forward_inputs.get("delta"))
    return telemetry.start(sc.SPAN_PYTORCH_SCHEDULE, sc.STAGE_ENGINE_SCHEDULE, attributes, context=Context(),
                           start_time=dispatch.start_ns, start_reading=dispatch.start_reading)


def schedule(telemetry: Telemetry):
    """`InputsMakerAsync._send_next_inputs_impl()`: returns (forward_inputs, running) or (None, None)."""

    async def wrapper(wrapped, instance, args, kwargs):
        dispatch = _Dispatch(time.time_ns(), telemetry.probe.read())
        token = _dispatching.set(dispatch)
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as error:
            if dispatch.handle is not None:
                dispatch.handle.end(error=error)
            raise
        finally:
            _dispatching.reset(token)
        forward_inputs, running = result if isinstance(result, tuple) and len(result) == 2 else (None, None)
        if forward_inputs is None:
            return result
        handle = dispatch.handle or _open_schedule_span(telemetry, dispatch, forward_inputs)
        attributes = safe(_running_attributes, running)
        for session_id in attributes.get(sc.STEP_SESSION_IDS, ()):
            request = telemetry.request_span_context(session_id)
            if request is not None:
                handle.add_link(request)
        handle.end(attributes)
        return result

    return wrapper


def dispatch_to_agent(telemetry: Telemetry, queues: StepQueues):
    """`BaseModelAgent.set_forward_inputs(inputs)`: the batch leaves the scheduler for the agent."""

    def wrapper(wrapped, instance, args, kwargs):
        dispatch = _dispatching.get()
        if dispatch is not None and dispatch.handle is None:
            forward_inputs = args[0] if args else kwargs.get("inputs")
            dispatch.handle = _open_schedule_span(telemetry, dispatch, forward_inputs)
            queues.queue(instance).append(dispatch.handle.context())
        return wrapped(*args, **kwargs)

    return wrapper


def forget_dispatched(queues: StepQueues):
    """`BaseModelAgent._drain_queues()`: batches thrown away will never reach a forward."""

    def wrapper(wrapped, instance, args, kwargs):
        queues.queue(instance).clear()
        return wrapped(*args, **kwargs)

    return wrapper


def forward(telemetry: Telemetry, queues: StepQueues):
    """`BaseModelAgent._async_step(inputs=..., delta=..., ...)`: the model runs the batch."""

    async def wrapper(wrapped, instance, args, kwargs):
        pending = queues.queue(instance)
        parent = pending.popleft() if pending else Context()
        handle = telemetry.start(sc.SPAN_PYTORCH_FORWARD, sc.STAGE_ENGINE_FORWARD,
                                 safe(_batch_attributes, kwargs.get("inputs"), kwargs.get("delta")), context=parent)
        token = otel_context.attach(handle.context())
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as error:
            otel_context.detach(token)
            handle.end(error=error)
            raise
        otel_context.detach(token)
        handle.end()
        return result

    return wrapper
