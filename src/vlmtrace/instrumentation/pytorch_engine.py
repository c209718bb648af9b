"""The PyTorch-engine layer: engine steps are traces of their own, one span per prefill step and one
per run of decode steps.

A step serves many requests at once, so it cannot be a child of any one of them: its
`lmdeploy.pytorch.forward` span links to the request spans of the sequences in the batch. What the
scheduler knows (the sequences, prefill or decode, how long scheduling took) is gathered when the
inputs maker hands the batch to the model agent and travels to the agent's forward through a
first-in-first-out queue per agent (the agent consumes batches in dispatch order). One span per
step, not one for scheduling and one for the forward: the engine loop is Python-bound, and each
span costs it time.

Decode steps (4-8 ms each, back to back) are one span per *run* (`DecodeRuns`): a span per decode
step carried nothing that the readings at its run's start and end do not (the KV cache is
preallocated; a decode step allocates transients only), and cost the engine loop a span and a
reading each. Prefill steps keep a span each: they run the ViT and take new sequences in.

Up to 0.6.4 the engine schedules and runs the model in one loop: `Engine._async_model_forward` is
the step, and the engine's `_running` holds its sequences. Nothing there tells when the engine goes
idle, so each of its steps stays a span.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import MAX_LISTED_ITEMS, argument
from vlmtrace.instrumentation.runtime import SpanHandle, Telemetry, safe, warn_once
from vlmtrace.instrumentation.vision import VitHooks
from vlmtrace.probes.memory import Reading

_log = logging.getLogger(__name__)

MAX_PENDING_STEPS = 64
BACK_TO_BACK_NS = 50_000_000
# Up to 0.6.4 a decode step (a span of its own there) ends with the newest reading when it is younger
# than this, instead of reading torch's counters afresh: each fresh reading costs the engine loop
# ~60-100 µs (docs/performance.md). Prefill steps always read: they run the ViT and take in new sequences.
DECODE_READ_INTERVAL_NS = 20_000_000
# A decode run ends at the first step end past this age even while decoding goes on: the engine's
# readings then stay at least as dense as the background sampler's (100 ms by default), and an ended
# run (its end reading included) reaches the journal within this of its last step.
RUN_BOUND_NS = 100_000_000


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
        if (
            last is None
            or last is not self._previous_end
            or time.perf_counter_ns() - last.monotonic_ns > BACK_TO_BACK_NS
        ):
            return None
        return last

    def end(self, kind: str | None) -> Reading | None:
        """The reading to end a step of `kind` with (a step span of its own: up to 0.6.4); None: take a
        fresh one."""
        last = self._probe.last
        if kind != "decode" or last is None or time.perf_counter_ns() - last.monotonic_ns > DECODE_READ_INTERVAL_NS:
            return None
        return last

    def ended(self) -> None:
        self._previous_end = self._probe.last


class StepInfo:
    """What the scheduler knows of one step, filled in as it learns it, read when the forward ends.

    On the engine loop a step keeps raw values only: the batch's shape as one tuple (`batch`: kind,
    sequences, tokens, KV tokens), read once when the batch leaves the scheduler, and the scheduling
    time in nanoseconds. The attribute dict, and the batch's sequences (`running`) as attributes and
    links to their requests, are built only for a step that opens a span (`learn`): a decode step inside
    a run would pay for them for nothing."""

    __slots__ = ("_attributes", "batch", "links", "running", "schedule_ns", "schedule_start_ns")

    def __init__(self, schedule_start_ns: int) -> None:
        self.schedule_start_ns = schedule_start_ns
        self.schedule_ns: int | None = None
        self.batch: tuple[str, int | None, int | None, int | None] | None = None
        self._attributes: dict[str, Any] | None = None
        self.links: list[SpanContext] = []
        self.running: Any = None

    @property
    def attributes(self) -> dict[str, Any]:
        """The step's span attributes (built on first use, kept up to date by `learn`)."""
        if self._attributes is None:
            self._attributes = _batch_attributes(self.batch) if self.batch is not None else {}
            if self.schedule_ns is not None:
                self._attributes[sc.STEP_SCHEDULE_SECONDS] = self.schedule_ns / 1e9
        return self._attributes

    def scheduled(self, schedule_ns: int) -> None:
        """The scheduler handed the batch over `schedule_ns` after it started looking for one."""
        self.schedule_ns = schedule_ns
        if self._attributes is not None:  # a span already holds them: it gets the time at its end
            self._attributes[sc.STEP_SCHEDULE_SECONDS] = schedule_ns / 1e9

    @property
    def kind(self) -> str | None:
        return self.batch[0] if self.batch is not None else self.attributes.get(sc.STEP_KIND)

    def counts(self) -> tuple[int, float, int | None]:
        """Tokens, scheduling seconds and KV tokens of the step, for its decode run's totals."""
        if self.batch is None:
            attributes = self.attributes
            return (
                attributes.get(sc.STEP_TOKENS, 0),
                attributes.get(sc.STEP_SCHEDULE_SECONDS, 0.0),
                attributes.get(sc.STEP_KV_TOKENS),
            )
        _, _, tokens, kv_tokens = self.batch
        return tokens or 0, (self.schedule_ns or 0) / 1e9, kv_tokens

    def learn(self, telemetry: Telemetry) -> None:
        """The sequences' attributes and their requests' links, once the scheduler has handed them over."""
        running, self.running = self.running, None
        if running is None:
            return
        attributes = self.attributes
        attributes.update(safe(_running_attributes, running))
        for session_id in attributes.get(sc.STEP_SESSION_IDS, ()):
            request = telemetry.request_span_context(session_id)
            if request is not None:
                self.links.append(request)


_scheduling: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar("vlmtrace_scheduling", default=None)


class StepQueues:
    """Per model agent, the steps dispatched and not yet picked up by a forward (the last agent's queue
    is at hand: one engine per process, whose agent asks twice a step)."""

    def __init__(self) -> None:
        self._queues: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._last: tuple[weakref.ref, collections.deque] | None = None

    def queue(self, agent: Any) -> collections.deque:
        last = self._last
        if last is not None and last[0]() is agent:
            return last[1]
        queue = self._queues.get(agent)
        if queue is None:
            queue = self._queues[agent] = collections.deque(maxlen=MAX_PENDING_STEPS)
        self._last = (weakref.ref(agent), queue)
        return queue


class DecodeRuns:
    """The engine's open decode run: one `lmdeploy.pytorch.forward` span from the start of a run's first
    decode step to the end of its last, with the readings at those two points, the first step's
    attributes and links (sequences only leave a run: new ones come in by a prefill step, which ends
    it), and the count of steps, tokens and scheduling time over all of them. A run ends
    - when a prefill step starts (its end reading is the prefill's start reading, back to back);
    - when the engine goes idle: the inputs maker found nothing to run, or dropped the batches
      dispatched; at the end of the step in flight, else at once;
    - at the end of the step that takes it past RUN_BOUND_NS, the next step starting a new run;
    - with an error, at the end of the step that raised; when vlmtrace is taken off (`end`).
    Its start is journalled when it opens, so a run open at a crash is in the journal with its start.
    One engine per process: its agent's forwards run one at a time, on the engine's event loop."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self.readings = StepReadings(telemetry)
        self._span: SpanHandle | None = None
        self._first: StepInfo | None = None
        self._started_ns = 0
        self._steps = 0
        self._tokens = 0
        self._schedule_seconds = 0.0
        self._kv_tokens: int | None = None
        self._in_flight = False
        self._dispatched: collections.deque = collections.deque()  # the agent's batches not yet run
        self._idle = False  # the inputs maker found nothing after the batches dispatched so far

    def step_starts(self, step: StepInfo, dispatched: collections.deque) -> SpanHandle:
        """A decode step starts: in the open run, or opening one (`dispatched`: the batches waiting for
        the agent, after this one)."""
        self._in_flight = True
        self._dispatched = dispatched
        if self._span is None:
            step.learn(self._telemetry)
            self._span = self._telemetry.start(
                sc.SPAN_PYTORCH_FORWARD,
                sc.STAGE_ENGINE_FORWARD,
                step.attributes,
                context=Context(),
                links=step.links,
                start_reading=self.readings.start(),
            )
            self._first = step
            self._started_ns = time.perf_counter_ns()
            self._steps = self._tokens = 0
            self._schedule_seconds = 0.0
        return self._span

    def step_ended(self, step: StepInfo, error: BaseException | None) -> None:
        """A decode step ended (`step`: what the scheduler knew of it by now)."""
        self._in_flight = False
        self._steps += 1
        if self._steps == 1 and self._first is not None:  # the scheduler had not handed the sequences over at its start
            self._first.learn(self._telemetry)
        tokens, schedule_seconds, self._kv_tokens = step.counts()
        self._tokens += tokens
        self._schedule_seconds += schedule_seconds
        if (
            error is not None
            or (self._idle and not self._dispatched)
            or time.perf_counter_ns() - self._started_ns >= RUN_BOUND_NS
        ):
            self.end(error)

    def dispatched(self) -> None:
        self._idle = False

    def went_idle(self) -> None:
        """The engine has nothing to run after the batches dispatched: the run ends with the last of them."""
        self._idle = True
        if not self._in_flight and not self._dispatched:
            self.end()

    def end(self, error: BaseException | None = None, reading: Reading | None = None) -> None:
        """End the open run, if any (`reading`: end with this one instead of reading now)."""
        span, self._span = self._span, None
        if span is None:
            return
        first = self._first
        if first is not None:  # what the scheduler learnt after the run's first forward had started
            first.learn(self._telemetry)
            span.set_attributes(first.attributes)
            for link in first.links[len(span.span.links or ()) :]:
                span.add_link(link)
        counts = {
            sc.STEP_COUNT: self._steps,
            sc.STEP_TOKENS: self._tokens,
            sc.STEP_SCHEDULE_SECONDS: self._schedule_seconds,
        }
        if self._kv_tokens is not None:
            counts[sc.STEP_KV_TOKENS] = self._kv_tokens
        try:
            span.end(counts, error=error, reading=reading)
        finally:
            self.readings.ended()


def _batch(inputs: Any, delta: Any) -> tuple[str, int | None, int | None, int | None]:
    """The batch's kind, sequences, tokens and KV tokens, read once where it leaves the scheduler."""
    kind = "decode" if inputs is None or getattr(inputs, "is_decoding", False) else "prefill"
    source = inputs if inputs is not None else delta
    if source is None:
        return kind, None, None, None
    seq_length = getattr(source, "seq_length", None)
    sequences = int(seq_length.shape[0]) if seq_length is not None and hasattr(seq_length, "shape") else None
    input_ids = getattr(inputs, "input_ids", None)
    tokens = int(input_ids.numel()) if input_ids is not None else sequences
    kv_tokens = getattr(source, "sum_kv_seqlen", None)
    return kind, sequences, tokens, int(kv_tokens) if kv_tokens is not None else None


def _batch_attributes(batch: tuple[str, int | None, int | None, int | None]) -> dict[str, Any]:
    kind, sequences, tokens, kv_tokens = batch
    attributes: dict[str, Any] = {sc.STEP_KIND: kind}
    if sequences is not None:
        attributes[sc.STEP_SEQUENCES] = sequences
    if tokens is not None:
        attributes[sc.STEP_TOKENS] = tokens
    if kv_tokens is not None:
        attributes[sc.STEP_KV_TOKENS] = kv_tokens
    return attributes


def _read_batch(inputs: Any, delta: Any) -> tuple[str, int | None, int | None, int | None] | None:
    """`_batch`, or None (with a warning, once) where LMDeploy's inputs moved."""
    try:
        return _batch(inputs, delta)
    except Exception as error:  # noqa: BLE001 - LMDeploy's inputs move between releases: never raise into its loop
        warn_once(
            "extract:_batch",
            "could not read a step's batch (%s: %s); step spans lack its shape",
            type(error).__name__,
            error,
            logger=_log,
        )
        return None


def _running_attributes(running: Any) -> dict[str, Any]:
    sequences = list(running or ())
    session_ids = [int(seq.session_id) for seq in sequences[:MAX_LISTED_ITEMS]]
    attributes: dict[str, Any] = {sc.STEP_SEQUENCES: len(sequences), sc.STEP_SESSION_IDS: session_ids}
    blocks = [len(seq.logical_blocks) for seq in sequences if hasattr(seq, "logical_blocks")]
    if blocks:
        attributes[sc.STEP_KV_BLOCKS] = sum(blocks)
    return attributes


def schedule(runs: DecodeRuns) -> Callable[..., Any]:
    """`InputsMakerAsync._send_next_inputs_impl()`: returns (forward_inputs, running) or (None, None).

    An idle poll costs a timestamp and nothing else, unless it ends a decode run."""

    async def wrapper(wrapped, instance, args, kwargs):
        step = StepInfo(time.time_ns())
        token = _scheduling.set(step)
        try:
            result = await wrapped(*args, **kwargs)
        finally:
            _scheduling.reset(token)
        if isinstance(result, tuple) and len(result) == 2 and result[0] is not None:
            step.running = result[1]
            step.scheduled(time.time_ns() - step.schedule_start_ns)
        elif isinstance(result, tuple) and result and result[0] is None:
            runs.went_idle()
        return result

    return wrapper


def dispatch_to_agent(queues: StepQueues, runs: DecodeRuns) -> Callable[..., Any]:
    """`BaseModelAgent.set_forward_inputs(inputs)`: the batch leaves the scheduler for the agent."""

    def wrapper(wrapped, instance, args, kwargs):
        step = _scheduling.get()
        if step is not None:
            forward_inputs = args[0] if args else kwargs.get("inputs")
            if isinstance(forward_inputs, dict):
                step.batch = _read_batch(forward_inputs.get("inputs"), forward_inputs.get("delta"))
            queues.queue(instance).append(step)
        runs.dispatched()
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

    async def wrapper(wrapped, instance, args, kwargs):
        vit_hooks.attach_once(instance, "patched_model")
        pending = queues.queue(instance)
        if pending:
            step = pending.popleft()
        else:  # a forward the scheduler did not dispatch: what its own arguments say
            step = StepInfo(time.time_ns())
            step.batch = _read_batch(kwargs.get("inputs"), kwargs.get("delta"))
        if step.kind == "decode":  # in the run's span, which this step opens or goes on
            token = otel_context.attach(runs.step_starts(step, pending).context())
            error = None
            try:
                return await wrapped(*args, **kwargs)
            except BaseException as exc:
                error = exc
                raise
            finally:
                otel_context.detach(token)
                runs.step_ended(step, error)
        runs.end()
        step.learn(telemetry)
        handle = telemetry.start(
            sc.SPAN_PYTORCH_FORWARD,
            sc.STAGE_ENGINE_FORWARD,
            step.attributes,
            context=Context(),
            links=step.links,
            start_reading=runs.readings.start(),
        )

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
        batch = _read_batch(argument(args, kwargs, 0, "inputs"), None)
        attributes = _batch_attributes(batch) if batch is not None else {}
        running = getattr(instance, "_running", None)
        if running is not None:
            attributes.update(safe(_running_attributes, running))
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
