"""The PyTorch-engine layer: engine steps are traces of their own, one span per prefill step and one
per run of decode steps.

A step serves many requests at once, so it cannot be a child of any one of them: its
`lmdeploy.pytorch.forward` span links to the request spans of the sequences in the batch. What the
scheduler knows (the sequences, prefill or decode, how long scheduling took) is gathered when the
inputs maker hands the batch to the model agent and travels to the agent's forward through a
first-in-first-out queue per agent (the agent consumes batches in dispatch order). One span per
step, not one for scheduling and one for the forward: the engine loop is Python-bound, and each
span costs it time.

Decode steps (4-8 ms each, back to back) are one span per *run* (pytorch_decode_runs.py); prefill
steps keep a span each: they run the ViT and take new sequences in. What a step carries from the scheduler
to the forward, and the reading it starts and ends with, is pytorch_steps.py's.

Up to 0.6.4 the engine schedules and runs the model in one loop: `Engine._async_model_forward` is
the step, and the engine's `_running` holds its sequences. Nothing there tells when the engine goes
idle, so each of its steps stays a span.
"""

from __future__ import annotations

import collections
import contextvars
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import argument
from vlmtrace.instrumentation.pytorch_decode_runs import DecodeRuns
from vlmtrace.instrumentation.pytorch_steps import (
    StepInfo,
    StepQueues,
    StepReadings,
    batch_attributes,
    read_batch,
    running_attributes,
)
from vlmtrace.instrumentation.runtime import Telemetry, safe
from vlmtrace.instrumentation.vision import VitHooks

_scheduling: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar("vlmtrace_scheduling", default=None)


def schedule(runs: DecodeRuns) -> Callable[..., Any]:
    """`InputsMakerAsync._send_next_inputs_impl()`: returns (forward_inputs, running) or (None, None).

    An idle poll costs a timestamp and nothing else, unless it ends a decode run."""
    time_ns, set_step, reset_step = time.time_ns, _scheduling.set, _scheduling.reset

    async def wrapper(wrapped, instance, args, kwargs):
        step = StepInfo(time_ns())
        token = set_step(step)
        try:
            result = await wrapped(*args, **kwargs)
        finally:
            reset_step(token)
        if isinstance(result, tuple) and result:
            if result[0] is None:
                runs.went_idle()
            elif len(result) == 2:
                step.running, step.schedule_ns = result[1], time_ns() - step.schedule_start_ns
        return result

    return wrapper


def _queue_of(
    queues: StepQueues, first_seen: Callable[[Any], None] | None = None
) -> Callable[[Any], collections.deque]:
    """A wrapper's lookup of an agent's queue of steps, the queue of the agent it saw last at hand (one
    engine per process, whose agent it sees every step); `first_seen(agent)` runs where another comes."""
    last: tuple[weakref.ref, collections.deque] | None = None

    def queue_of(agent: Any) -> collections.deque:
        nonlocal last
        if last is not None and last[0]() is agent:
            return last[1]
        if first_seen is not None:
            first_seen(agent)
        queue = queues.queue(agent)
        last = (weakref.ref(agent), queue)
        return queue

    return queue_of


def dispatch_to_agent(queues: StepQueues, runs: DecodeRuns) -> Callable[..., Any]:
    """`BaseModelAgent.set_forward_inputs(inputs)`: the batch leaves the scheduler for the agent."""
    current_step, queue_of = _scheduling.get, _queue_of(queues)

    def wrapper(wrapped, instance, args, kwargs):
        step = current_step()
        if step is not None:
            forward_inputs = args[0] if args else kwargs.get("inputs")
            if isinstance(forward_inputs, dict):
                step.batch = read_batch(forward_inputs.get("inputs"), forward_inputs.get("delta"))
            queue_of(instance).append(step)
        runs.idle = False  # the engine has this batch to run
        return wrapped(*args, **kwargs)

    return wrapper


def forget_dispatched(queues: StepQueues, runs: DecodeRuns) -> Callable[..., Any]:
    """`BaseModelAgent._drain_queues()`: batches thrown away will never reach a forward."""

    def wrapper(wrapped, instance, args, kwargs):
        queues.queue(instance).clear()
        runs.went_idle()
        return wrapped(*args, **kwargs)

    return wrapper


def forward(telemetry: Telemetry, queues: StepQueues, vit_hooks: VitHooks, runs: DecodeRuns) -> Callable[..., Any]:
    """`BaseModelAgent._async_step(inputs=..., delta=..., ...)`: the model runs the batch.

    The agent's ViT is hooked at its first step, so instrumenting after the engine was built works."""
    attach, detach = otel_context.attach, otel_context.detach
    step_starts, step_ended = runs.step_starts, runs.step_ended
    queue_of = _queue_of(queues, lambda agent: vit_hooks.attach_once(agent, "patched_model"))

    async def wrapper(wrapped, instance, args, kwargs):
        pending = queue_of(instance)
        if pending:
            step = pending.popleft()
        else:  # a forward the scheduler did not dispatch: what its own arguments say
            step = StepInfo(time.time_ns())
            step.batch = read_batch(kwargs.get("inputs"), kwargs.get("delta"))
        batch = step.batch
        if (batch[0] if batch is not None else step.kind) == "decode":  # in its run's span: opens or goes on
            token = attach(step_starts(step, pending))
            error = None
            try:
                return await wrapped(*args, **kwargs)
            except BaseException as exc:
                error = exc
                raise
            finally:
                detach(token)
                step_ended(step, error)
        runs.end()
        handle = step.start_span(telemetry, runs.readings)

        def learnt_meanwhile() -> None:
            """What the scheduler learnt after the forward had started."""
            step.learn(telemetry)
            handle.set_attributes(step.attributes)
            for link in step.links[len(handle.span.links) :]:
                handle.add_link(link)

        try:
            with handle.active(finish=learnt_meanwhile):
                return await wrapped(*args, **kwargs)
        finally:
            runs.readings.ended()

    return wrapper


def engine_model_forward(telemetry: Telemetry) -> Callable[..., Any]:
    """`Engine._async_model_forward(inputs, swap_in_map, swap_out_map, return_logits)` (0.4–0.6.4)."""

    readings = StepReadings(telemetry)

    async def wrapper(wrapped, instance, args, kwargs):
        batch = read_batch(argument(args, kwargs, 0, "inputs"), None)
        attributes = batch_attributes(batch) if batch is not None else {}
        running = getattr(instance, "_running", None)
        if running is not None:
            attributes.update(safe(running_attributes, running))
        links = [
            context
            for context in map(telemetry.request_span_context, attributes.get(sc.STEP_SESSION_IDS, ()))
            if context is not None
        ]
        try:
            with telemetry.start(
                sc.SPAN_PYTORCH_FORWARD,
                sc.STAGE_ENGINE_FORWARD,
                attributes,
                context=Context(),
                links=links,
                start_reading=readings.start(),
            ).active(end_reading=lambda: readings.end(attributes.get(sc.STEP_KIND))):
                return await wrapped(*args, **kwargs)
        finally:
            readings.ended()

    return wrapper
