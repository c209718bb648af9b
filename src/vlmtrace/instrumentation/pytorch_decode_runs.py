"""Decode steps (4-8 ms each, back to back) as one `lmdeploy.pytorch.forward` span per *run*: a span per
decode step carried nothing that the readings at its run's start and end do not (the KV cache is
preallocated; a decode step allocates transients only), and cost the engine loop a span and a reading each.
"""

from __future__ import annotations

import collections
import time

from opentelemetry.context import Context

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.pytorch_steps import StepInfo, StepReadings
from vlmtrace.instrumentation.runtime import SpanHandle, Telemetry
from vlmtrace.probes.memory import Reading

# A decode run ends at the first step end past this age even while decoding goes on: the engine's
# readings then stay at least as dense as the background sampler's (100 ms by default), and an ended
# run (its end reading included) reaches the journal within this of its last step.
RUN_BOUND_NS = 100_000_000


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
        self._context: Context | None = None  # the open run's span as the current context
        self._first: StepInfo | None = None
        self._bound_ns = 0  # when the open run has run RUN_BOUND_NS (perf_counter_ns)
        self._steps = 0
        self._tokens = 0
        self._schedule_ns = 0
        self._kv_tokens: int | None = None
        self._in_flight = False
        self._dispatched: collections.deque = collections.deque()  # the agent's batches not yet run
        # The inputs maker found nothing after the batches dispatched so far (a dispatch sets it back).
        self.idle = False

    def step_starts(self, step: StepInfo, dispatched: collections.deque) -> Context:
        """A decode step starts: in the open run, or opening one (`dispatched`: the batches waiting for
        the agent, after this one). Returns the context the step runs in: the run's span current."""
        self._in_flight = True
        self._dispatched = dispatched
        context = self._context
        if context is None:
            span = self._span = step.start_span(self._telemetry, self.readings)
            context = self._context = span.context()
            self._first = step
            self._bound_ns = time.perf_counter_ns() + RUN_BOUND_NS
            self._steps = self._tokens = self._schedule_ns = 0
        return context

    def step_ended(self, step: StepInfo, error: BaseException | None) -> None:
        """A decode step ended (`step`: what the scheduler knew of it by now)."""
        self._in_flight = False
        self._steps += 1
        if self._steps == 1 and self._first is not None:  # the scheduler had not handed the sequences over at its start
            self._first.learn(self._telemetry)
        batch = step.batch  # kind, sequences, tokens, KV tokens
        if batch is not None:
            self._tokens += batch[2] or 0
            self._kv_tokens = batch[3]
        else:
            self._kv_tokens = None
        self._schedule_ns += step.schedule_ns or 0
        if error is not None or (self.idle and not self._dispatched) or time.perf_counter_ns() >= self._bound_ns:
            self.end(error)

    def went_idle(self) -> None:
        """The engine has nothing to run after the batches dispatched: the run ends with the last of them."""
        self.idle = True
        if not self._in_flight and not self._dispatched:
            self.end()

    def end(self, error: BaseException | None = None, reading: Reading | None = None) -> None:
        """End the open run, if any (`reading`: end with this one instead of reading now)."""
        span, self._span = self._span, None
        if span is None:
            return
        self._context = None
        first = self._first
        if first is not None:  # what the scheduler learnt after the run's first forward had started
            first.learn(self._telemetry)
            span.set_attributes(first.attributes)
            for link in first.links[len(span.span.links or ()) :]:
                span.add_link(link)
        counts = {
            sc.STEP_COUNT: self._steps,
            sc.STEP_TOKENS: self._tokens,
            sc.STEP_SCHEDULE_SECONDS: self._schedule_ns / 1e9,
        }
        if self._kv_tokens is not None:
            counts[sc.STEP_KV_TOKENS] = self._kv_tokens
        try:
            span.end(counts, error=error, reading=reading)
        finally:
            self.readings.ended()
