"""A PyTorch-engine step as vlmtrace follows it from the scheduler to the model agent's forward: the
reading it starts and ends with (`StepReadings`), what the scheduler knows of it (`StepInfo`: the batch's
shape, the sequences, the scheduling time), and the first-in-first-out queue per agent it waits in between
(`StepQueues`). pytorch_engine.py's wrappers fill these in; pytorch_decode_runs.py spans a run of decode steps.
"""

from __future__ import annotations

import collections
import logging
import time
import weakref
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import MAX_LISTED_ITEMS
from vlmtrace.instrumentation.runtime import SpanHandle, Telemetry, safe, warn_once
from vlmtrace.probes.memory import Reading

_log = logging.getLogger(__name__)

MAX_PENDING_STEPS = 64
_NO_LINKS: tuple = ()  # shared by the steps that link no request
BACK_TO_BACK_NS = 50_000_000
# Up to 0.6.4 a decode step (a span of its own there) ends with the newest reading when it is younger
# than this, instead of reading torch's counters afresh: each fresh reading costs the engine loop
# ~60-100 µs (docs/performance.md). Prefill steps always read: they run the ViT and take in new sequences.
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
    time in nanoseconds (`schedule_ns`, with the sequences it handed over, `running`, both set once the
    scheduler returns). The attribute dict, and the batch's sequences (`running`) as attributes and
    links to their requests, are built only for a step that opens a span (`learn`): a decode step inside
    a run would pay for them for nothing."""

    __slots__ = ("_attributes", "batch", "links", "running", "schedule_ns", "schedule_start_ns")

    def __init__(self, schedule_start_ns: int) -> None:
        self.schedule_start_ns = schedule_start_ns
        self.schedule_ns: int | None = None
        self.batch: tuple[str, int | None, int | None, int | None] | None = None
        self._attributes: dict[str, Any] | None = None
        self.links: list[SpanContext] | tuple = _NO_LINKS  # a list once `learn` found requests to link
        self.running: Any = None

    @property
    def attributes(self) -> dict[str, Any]:
        """The step's span attributes (built on first use, kept up to date by `learn` and with the
        scheduling time once known: a span that started before gets it at its end)."""
        attributes = self._attributes
        if attributes is None:
            attributes = self._attributes = batch_attributes(self.batch) if self.batch is not None else {}
        if self.schedule_ns is not None:
            attributes[sc.STEP_SCHEDULE_SECONDS] = self.schedule_ns / 1e9
        return attributes

    @property
    def kind(self) -> str | None:
        return self.batch[0] if self.batch is not None else self.attributes.get(sc.STEP_KIND)

    def learn(self, telemetry: Telemetry) -> None:
        """The sequences' attributes and their requests' links, once the scheduler has handed them over."""
        running, self.running = self.running, None
        if running is None:
            return
        attributes = self.attributes
        attributes.update(safe(running_attributes, running))
        found = [
            request
            for request in map(telemetry.request_span_context, attributes.get(sc.STEP_SESSION_IDS, ()))
            if request is not None
        ]
        if found:
            self.links = [*self.links, *found]

    def start_span(self, telemetry: Telemetry, readings: StepReadings) -> SpanHandle:
        """The step's `lmdeploy.pytorch.forward` span, from what the scheduler has handed over so far: a
        trace of its own, linked to its requests, with a fresh reading at its start."""
        self.learn(telemetry)
        return telemetry.start(
            sc.SPAN_PYTORCH_FORWARD,
            sc.STAGE_ENGINE_FORWARD,
            self.attributes,
            context=Context(),
            links=self.links,
            start_reading=readings.start(),
        )


class StepQueues:
    """Per model agent, the steps dispatched and not yet picked up by a forward (the wrappers keep the
    queue of the agent they saw last at hand: one engine per process, whose agent they see every step)."""

    def __init__(self) -> None:
        self._queues: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def queue(self, agent: Any) -> collections.deque:
        queue = self._queues.get(agent)
        if queue is None:
            queue = self._queues[agent] = collections.deque(maxlen=MAX_PENDING_STEPS)
        return queue


def read_batch(inputs: Any, delta: Any) -> tuple[str, int | None, int | None, int | None] | None:
    """The batch's kind, sequences, tokens and KV tokens, read once where it leaves the scheduler: a
    whole `ModelInputs`, or a decode step's `ModelInputsDelta`, whose `seq_length` would build a tensor
    (its rows are its sequences', a token each). None (with a warning, once) where LMDeploy's inputs moved."""
    if inputs is not None:
        try:  # ModelInputs as LMDeploy has it: its tensors' shapes and its KV tokens, an int
            return (
                "decode" if inputs.is_decoding else "prefill",
                inputs.seq_length.shape[0],
                inputs.input_ids.numel(),
                int(inputs.sum_kv_seqlen),
            )
        except (AttributeError, TypeError, IndexError):
            pass
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


def _batch(inputs: Any, delta: Any) -> tuple[str, int | None, int | None, int | None]:
    """`read_batch` where the inputs are not as LMDeploy has them now (or are a delta)."""
    if inputs is not None:
        kind = "decode" if getattr(inputs, "is_decoding", False) else "prefill"
        sequences = _rows(getattr(inputs, "seq_length", None))
        input_ids = getattr(inputs, "input_ids", None)
        tokens = input_ids.numel() if input_ids is not None else sequences
        kv_tokens = getattr(inputs, "sum_kv_seqlen", None)
    elif delta is not None:
        kind = "decode"
        indices = getattr(delta, "indice_cpu", None)
        sequences = len(indices) if indices is not None else _rows(getattr(delta, "seq_length", None))
        tokens = sequences
        kv_tokens = getattr(delta, "sum_kv_seqlen", None)
    else:
        return "decode", None, None, None
    return (
        kind,
        int(sequences) if sequences is not None else None,
        int(tokens) if tokens is not None else None,
        int(kv_tokens) if kv_tokens is not None else None,
    )


def _rows(tensor: Any) -> int | None:
    return int(tensor.shape[0]) if tensor is not None and hasattr(tensor, "shape") else None


def batch_attributes(batch: tuple[str, int | None, int | None, int | None]) -> dict[str, Any]:
    kind, sequences, tokens, kv_tokens = batch
    attributes: dict[str, Any] = {sc.STEP_KIND: kind}
    if sequences is not None:
        attributes[sc.STEP_SEQUENCES] = sequences
    if tokens is not None:
        attributes[sc.STEP_TOKENS] = tokens
    if kv_tokens is not None:
        attributes[sc.STEP_KV_TOKENS] = kv_tokens
    return attributes


def running_attributes(running: Any) -> dict[str, Any]:
    sequences = list(running or ())
    session_ids = [int(seq.session_id) for seq in sequences[:MAX_LISTED_ITEMS]]
    attributes: dict[str, Any] = {sc.STEP_SEQUENCES: len(sequences), sc.STEP_SESSION_IDS: session_ids}
    blocks = [len(seq.logical_blocks) for seq in sequences if hasattr(seq, "logical_blocks")]
    if blocks:
        attributes[sc.STEP_KV_BLOCKS] = sum(blocks)
    return attributes
