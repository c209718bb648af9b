"""The PyTorch-engine layer: each engine step is a trace of its own, one span long.

A step serves many requests at once, so it cannot be a child of any one of them: its
`lmdeploy.pytorch.forward` span links to the request spans of the sequences in the batch. What the
scheduler knows (the sequences, prefill or decode, how long scheduling took) is gathered when the
inputs maker hands the batch to the model agent and travels to the agent's forward through a
first-in-first-out queue per agent (the agent consumes batches in dispatch order). One span per
step, not one for scheduling and one for the forward: the engine loop is Python-bound, and each
span costs it time.

Up to 0.6.4 the engine schedules and runs the model in one loop: `Engine._async_model_forward` is
the step, and the engine's `_running` holds its sequences.
"""

from __future__ import annotations

import collections
import contextvars
import time
import weakref
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import MAX_LISTED_ITEMS, argument
from vlmtrace.instrumentation.runtime import Telemetry, safe
from vlmtrace.instrumentation.vision import VitHooks
from vlmtrace.probes.memory import Reading

MAX_PENDING_STEPS = 64
BACK_TO_BACK_NS = 50_000_000
# A decode step ends with the newest reading when it is younger than this, instead of reading torch's
# counters afresh: decode steps of 4-8 ms follow each other and allocate only transients (the KV cache
# is preallocated), while each fresh reading costs the engine loop ~60-100 µs (docs/benchmarks.md).
# Prefill steps always read: they run the ViT and take in new sequences.
DECODE_READ_INTERVAL_NS = 20_000_000


class StepReadings:
    """A step's start reading is the previous step's end reading when nothing was read in between and
    the steps ran back to back: on the PyTorch engine torch's counters are live, a fresh reading costs
    a `_cuda_memoryStats` call (~100 µs inside the engine loop on an H200 host), and the engine loop
    is what the latency waits on. What the scheduler allocated between two steps is then counted in
    the step that it prepared."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._probe = telemetry.probe
        self._previous_end: Reading | None = None

    def start(self) -> Reading | None:
        """The reading to start the next step with; None: take a fresh one."""
        last = self._probe.last
        if last is None or last is not self._previous_end or time.perf_counter_ns() - last.monotonic_ns > BACK_TO_BACK_NS:
            return None
        return last

    def end(self, kind: str) -> Reading | None:
        """The reading to end a step of `kind` with; None: take a fresh one."""
        last = self._probe.last
        if kind != "decode" or last is None or time.perf_counter_ns() - last.monotonic_ns > DECODE_READ_INTERVAL_NS:
            return None
        return last

    def ended(self) -> None:
        self._previous_end = self._probe.last


class StepInfo:
    """What the scheduler knows of one step, filled in as it learns it, read when the forward ends."""

    __slots__ = ("schedule_start_ns", "attributes", "links")

    def __init__(self, schedule_start_ns: int) -> None:
        self.schedule_start_ns = schedule_start_ns
        self.attributes: dict[str, Any] = {}
        self.links: list[SpanContext] = []


_scheduling: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar("vlmtrace_scheduling", default=None)


class StepQueues:
    """Per model agent, the steps dispatched and not yet picked up by a forward."""

    def __init__(self) -> None:
        self._queues: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def queue(self, agent: Any) -> collections.deque:
        queue = self._queues.get(agent)
        if queue is None:
            queue = self._queues[agent] = collections.deque(maxlen=MAX_PENDING_STEPS)
        return queue


def _kind(inputs: Any) -> str:
    if inputs is None:
        return "decode"
    return "decode" if getattr(inputs, "is_decoding", False) else "prefill"


def _batch_attributes(inputs: Any, delta: Any) -> dict[str, Any]:
    source = inputs if inputs is not None else delta
    attributes: dict[str, Any] = {sc.STEP_KIND: _kind(inputs)}
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


def schedule(telemetry: Telemetry):
    """`InputsMakerAsync._send_next_inputs_impl()`: returns (forward_inputs, running) or (None, None).

    An idle poll costs a timestamp and nothing else: no reading, no span."""

    async def wrapper(wrapped, instance, args, kwargs):
        step = StepInfo(time.time_ns())
        token = _scheduling.set(step)
        try:
            result = await wrapped(*args, **kwargs)
        finally:
            _scheduling.reset(token)
        if isinstance(result, tuple) and len(result) == 2 and result[0] is not None:
            step.attributes.update(safe(_running_attributes, result[1]))
            step.attributes[sc.STEP_SCHEDULE_SECONDS] = (time.time_ns() - step.schedule_start_ns) / 1e9
            for session_id in step.attributes.get(sc.STEP_SESSION_IDS, ()):
                request = telemetry.request_span_context(session_id)
                if request is not None:
                    step.links.append(request)
        return result

    return wrapper


def dispatch_to_agent(queues: StepQueues):
    """`BaseModelAgent.set_forward_inputs(inputs)`: the batch leaves the scheduler for the agent."""

    def wrapper(wrapped, instance, args, kwargs):
        step = _scheduling.get()
        if step is not None:
            forward_inputs = args[0] if args else kwargs.get("inputs")
            if isinstance(forward_inputs, dict):
                step.attributes.update(safe(_batch_attributes, forward_inputs.get("inputs"),
                                            forward_inputs.get("delta")))
            queues.queue(instance).append(step)
        return wrapped(*args, **kwargs)

    return wrapper


def forget_dispatched(queues: StepQueues):
    """`BaseModelAgent._drain_queues()`: batches thrown away will never reach a forward."""

    def wrapper(wrapped, instance, args, kwargs):
        queues.queue(instance).clear()
        return wrapped(*args, **kwargs)

    return wrapper


def forward(telemetry: Telemetry, queues: StepQueues, vit_hooks: VitHooks):
    """`BaseModelAgent._async_step(inputs=..., delta=..., ...)`: the model runs the batch.

    The agent's ViT is hooked at its first step, so instrumenting after the engine was built works."""
    readings = StepReadings(telemetry)

    async def wrapper(wrapped, instance, args, kwargs):
        vit_hooks.attach_once(instance, "patched_model")
        pending = queues.queue(instance)
        step = pending.popleft() if pending else None
        attributes = dict(step.attributes) if step is not None else safe(
            _batch_attributes, kwargs.get("inputs"), kwargs.get("delta"))
        handle = telemetry.start(sc.SPAN_PYTORCH_FORWARD, sc.STAGE_ENGINE_FORWARD, attributes, context=Context(),
                                 links=step.links if step is not None else None, start_reading=readings.start())

        def learnt_meanwhile() -> None:
            """What the scheduler learnt after the forward had started."""
            handle.set_attributes(step.attributes)
            for link in step.links[len(handle.span.links):]:
                handle.add_link(link)

        try:
            with handle.active(finish=learnt_meanwhile if step is not None else None,
                               end_reading=lambda: readings.end(attributes.get(sc.STEP_KIND))):
                return await wrapped(*args, **kwargs)
        finally:
            readings.ended()

    return wrapper


def engine_model_forward(telemetry: Telemetry):
    """`Engine._async_model_forward(inputs, swap_in_map, swap_out_map, return_logits)` (0.4–0.6.4)."""

    readings = StepReadings(telemetry)

    async def wrapper(wrapped, instance, args, kwargs):
        attributes = safe(_batch_attributes, argument(args, kwargs, 0, "inputs"), None)
        running = getattr(instance, "_running", None)
        if running is not None:
            attributes.update(safe(_running_attributes, running))
        links = [context for context in map(telemetry.request_span_context, attributes.get(sc.STEP_SESSION_IDS, ()))
                 if context is not None]
        try:
            with telemetry.start(sc.SPAN_PYTORCH_FORWARD, sc.STAGE_ENGINE_FORWARD, attributes, context=Context(),
                                 links=links, start_reading=readings.start()).active(
                                     end_reading=lambda: readings.end(attributes.get(sc.STEP_KIND))):
                return await wrapped(*args, **kwargs)
        finally:
            readings.ended()

    return wrapper
