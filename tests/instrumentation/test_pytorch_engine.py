"""PyTorch-engine steps: LMDeploy's real scheduling code (`InputsMakerAsync._send_next_inputs_impl`,
`BaseModelAgent.set_forward_inputs`) over a stand-in scheduler and model; the model forward, which
needs a GPU, is the only part replaced."""

from __future__ import annotations

import asyncio
import time
import types

import torch
from lmdeploy.pytorch.engine.inputs_maker import InputsMakerAsync
from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent
from lmdeploy.pytorch.model_inputs import ModelInputs
from opentelemetry import trace

from tests.instrumentation.conftest import finished, spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation import pytorch_engine, pytorch_steps
from vlmtrace.instrumentation.runtime import RequestState
from vlmtrace.probes.memory import Reading


class StandinScheduler:
    def __init__(self):
        self.ticks = 0

    def resume_completed_migrations(self):
        pass

    def tick(self):
        self.ticks += 1


class StandinExecutor:
    """UniExecutor.forward_async's behaviour: hand the batch to the in-process agent."""

    def __init__(self, agent):
        self.agent = agent

    async def forward_async(self, inputs):
        self.agent.set_forward_inputs(inputs)
        await asyncio.sleep(0)


def _prefill_inputs(lengths: list[int]) -> ModelInputs:
    total = sum(lengths)
    return ModelInputs(
        input_ids=torch.zeros((1, total), dtype=torch.long),
        seq_length=torch.tensor(lengths),
        history_lengths=torch.zeros(len(lengths), dtype=torch.long),
        block_offsets=torch.zeros((len(lengths), 4), dtype=torch.long),
        is_decoding=False,
        num_ignored_history=torch.zeros(len(lengths), dtype=torch.long),
        max_q_seqlen=max(lengths),
        max_kv_seqlen=max(lengths),
        sum_kv_seqlen=total,
    )


def _sequence(session_id: int, blocks: int):
    return types.SimpleNamespace(session_id=session_id, logical_blocks=[0] * blocks)


def test_a_step_is_one_span_linked_to_its_requests_with_what_the_scheduler_knew(traced, exporter):
    agent = object.__new__(BaseModelAgent)
    maker = object.__new__(InputsMakerAsync)
    maker.scheduler = StandinScheduler()
    maker.executor = StandinExecutor(agent)
    maker.do_prefill = lambda: True
    running = [_sequence(7, 3), _sequence(8, 2)]
    maker._make_forward_inputs = lambda prefill, enable_empty: dict(
        inputs=_prefill_inputs([20, 12]), delta=None, running=running
    )

    telemetry = traced.telemetry
    tracer = traced.tracing.provider().get_tracer("test")
    for sid in (7, 8):
        caller = tracer.start_span(f"caller of {sid}")
        telemetry.requests.put(
            sid,
            RequestState(telemetry.start(f"chat {sid}", sc.STAGE_REQUEST, context=trace.set_span_in_context(caller))),
        )

    async def model_forward(**inputs):  # the GPU part
        assert inputs["inputs"].sum_kv_seqlen == 32
        return "forwarded"

    forward = pytorch_engine.forward(telemetry, traced.step_queues, traced.vit_hooks, traced.decode_runs)

    async def one_step():
        agent._pre_in_que = asyncio.Queue()
        forward_inputs, next_running = await maker._send_next_inputs_impl()
        queued = agent._pre_in_que.get_nowait()
        assert queued is forward_inputs
        result = await forward(model_forward, agent, (), dict(queued))
        return next_running, result

    next_running, result = asyncio.run(one_step())
    assert result == "forwarded"
    assert next_running is running
    assert maker.scheduler.ticks == 1

    (step,) = spans_by_name(exporter)[sc.SPAN_PYTORCH_FORWARD]
    assert step.parent is None
    a = step.attributes
    assert a[sc.STAGE] == sc.STAGE_ENGINE_FORWARD
    assert a[sc.STEP_KIND] == "prefill"
    assert a[sc.STEP_SEQUENCES] == 2
    assert a[sc.STEP_TOKENS] == 32
    assert a[sc.STEP_KV_TOKENS] == 32
    assert a[sc.STEP_KV_BLOCKS] == 5
    assert tuple(a[sc.STEP_SESSION_IDS]) == (7, 8)
    assert a[sc.STEP_SCHEDULE_SECONDS] > 0
    linked = {link.context.span_id for link in step.links}
    assert linked == {telemetry.requests.get(sid).handle.span_context.span_id for sid in (7, 8)}


def test_an_idle_poll_leaves_no_span(traced, exporter):
    maker = object.__new__(InputsMakerAsync)
    maker.scheduler = StandinScheduler()
    maker.do_prefill = lambda: False
    maker._make_forward_inputs = lambda prefill, enable_empty: None
    assert asyncio.run(maker._send_next_inputs_impl(enable_empty=True)) == (None, None)
    assert finished(exporter) == ()


def test_drained_batches_do_not_shift_later_steps(traced, exporter):
    agent = object.__new__(BaseModelAgent)
    agent._pre_in_que = agent._in_que = agent._out_que = None
    traced.step_queues.queue(agent).append("stale step context")
    agent._drain_queues()
    assert len(traced.step_queues.queue(agent)) == 0


class LiveTorchProbe:
    """Torch's counters live, as on the PyTorch engine: every read is a fresh measurement."""

    def __init__(self):
        self.last = None
        self.measurements = 0

    def read(self):
        self.measurements += 1
        self.last = Reading(time.perf_counter_ns(), {sc.MEM_TORCH_ALLOCATED: self.measurements})
        return self.last


def test_back_to_back_steps_share_a_reading_and_anything_read_in_between_breaks_the_chain():
    probe = LiveTorchProbe()
    readings = pytorch_steps.StepReadings(types.SimpleNamespace(probe=probe))
    assert readings.start() is None  # the first step reads afresh
    end_of_first = probe.read()
    readings.ended()
    assert readings.start() is end_of_first  # the next step starts from it: one measurement saved

    readings.ended()
    probe.read()  # another span read meanwhile (a request ended): its changes are not the step's
    assert readings.start() is None

    readings.ended()
    probe.last = Reading(time.perf_counter_ns() - 2 * pytorch_steps.BACK_TO_BACK_NS, {})
    readings.ended()
    assert readings.start() is None  # an idle engine: the gap is not the next step's


def test_a_decode_step_ends_with_a_recent_reading_and_a_prefill_step_always_reads():
    probe = LiveTorchProbe()
    readings = pytorch_steps.StepReadings(types.SimpleNamespace(probe=probe))
    assert readings.end("decode") is None  # nothing read yet
    recent = probe.read()
    assert readings.end("decode") is recent
    assert readings.end("prefill") is None
    probe.last = Reading(time.perf_counter_ns() - 2 * pytorch_steps.DECODE_READ_INTERVAL_NS, {})
    assert readings.end("decode") is None  # too old: read afresh
