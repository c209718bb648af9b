"""PyTorch-engine decode steps as one span per run: LMDeploy's real scheduling code
(`InputsMakerAsync._send_next_inputs_impl`, `BaseModelAgent.set_forward_inputs`) over a scripted
scheduler; the model forward, which needs a GPU, is the only part replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import types

import numpy as np
import pytest
import torch
from lmdeploy.pytorch.engine.inputs_maker import InputsMakerAsync
from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent
from lmdeploy.pytorch.model_inputs import ModelInputs, ModelInputsDelta
from opentelemetry import trace

from tests.export.child_process import start_python
from tests.export.journal_lines import journal_files, of_kind, read_journal_file
from tests.instrumentation.conftest import spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation import pytorch_decode_runs, pytorch_engine
from vlmtrace.instrumentation.runtime import RequestState

HERE = os.path.dirname(os.path.abspath(__file__))
IDLE = None  # a scripted poll that finds nothing to run


def _inputs(lengths: list[int], decoding: bool) -> ModelInputs:
    total = sum(lengths)
    return ModelInputs(
        input_ids=torch.zeros((1, total), dtype=torch.long),
        seq_length=torch.tensor(lengths),
        history_lengths=torch.full((len(lengths),), 40 if decoding else 0, dtype=torch.long),
        block_offsets=torch.zeros((len(lengths), 4), dtype=torch.long),
        is_decoding=decoding,
        num_ignored_history=torch.zeros(len(lengths), dtype=torch.long),
        max_q_seqlen=max(lengths),
        max_kv_seqlen=max(lengths) + (40 if decoding else 0),
        sum_kv_seqlen=total + (40 * len(lengths) if decoding else 0),
    )


def prefill(session_ids: list[int]) -> dict:
    return {"inputs": _inputs([20] * len(session_ids), False), "delta": None, "running": _running(session_ids)}


def decode(session_ids: list[int]) -> dict:
    return {"inputs": _inputs([1] * len(session_ids), True), "delta": None, "running": _running(session_ids)}


def _running(session_ids: list[int]) -> list:
    return [types.SimpleNamespace(session_id=sid, logical_blocks=[0, 0]) for sid in session_ids]


class ScriptedEngine:
    """The engine loop's order: poll the inputs maker, then run the batch it dispatched. A poll inside
    a forward (`prefetch_during`) is the engine's prefetch, made while the batch before it runs; one
    before it (`prefetch_before`), made while the batch waits for the agent."""

    def __init__(
        self, traced, script: list, prefetch_during: set[int] = frozenset(), prefetch_before: set[int] = frozenset()
    ):
        self.agent = object.__new__(BaseModelAgent)
        self.maker = object.__new__(InputsMakerAsync)
        self.maker.scheduler = types.SimpleNamespace(resume_completed_migrations=lambda: None, tick=lambda: None)
        self.maker.executor = types.SimpleNamespace(forward_async=self._forward_async)
        self.maker.do_prefill = lambda: True
        self.maker._make_forward_inputs = lambda prefill, enable_empty: self._script.pop(0)
        self._script = list(script)
        self._prefetch_during = prefetch_during
        self._prefetch_before = prefetch_before
        self._forward = pytorch_engine.forward(
            traced.telemetry, traced.step_queues, traced.vit_hooks, traced.decode_runs
        )
        self.steps = 0

    async def _forward_async(self, inputs):
        self.agent.set_forward_inputs(inputs)

    async def _model_forward(self, **inputs):  # the GPU part
        if self.steps in self._prefetch_during:
            assert await self.maker._send_next_inputs_impl(enable_empty=True) == (None, None)
        self.steps += 1

    def run(self):
        async def loop():
            self.agent._pre_in_que = asyncio.Queue()
            while self._script:
                forward_inputs, _ = await self.maker._send_next_inputs_impl()
                if forward_inputs is not None:
                    if self.steps in self._prefetch_before:
                        assert await self.maker._send_next_inputs_impl(enable_empty=True) == (None, None)
                    await self._forward(self._model_forward, self.agent, (), dict(self.agent._pre_in_que.get_nowait()))

        asyncio.run(loop())


def _requests(traced, session_ids):
    telemetry = traced.telemetry
    tracer = traced.tracing.provider().get_tracer("test")
    for sid in session_ids:
        caller = tracer.start_span(f"caller of {sid}")
        telemetry.requests.put(
            sid,
            RequestState(telemetry.start(f"chat {sid}", sc.STAGE_REQUEST, context=trace.set_span_in_context(caller))),
        )
    return {telemetry.requests.get(sid).handle.span_context.span_id for sid in session_ids}


def _steps(exporter) -> list:
    return sorted(spans_by_name(exporter)[sc.SPAN_PYTORCH_FORWARD], key=lambda span: span.start_time)


def _read_times(span) -> tuple[int, int]:
    a = span.attributes
    return a[sc.MEM_READ_TIME] - a[sc.MEM_READ_TIME + sc.DELTA_SUFFIX], a[sc.MEM_READ_TIME]


def test_a_run_of_decode_steps_is_one_span_ended_by_the_next_prefill(traced, exporter):
    requests = _requests(traced, (7, 8))
    ScriptedEngine(traced, [prefill([7, 8]), decode([7, 8]), decode([7, 8]), decode([7]), prefill([9])]).run()

    first, run, second = _steps(exporter)
    assert [s.attributes[sc.STEP_KIND] for s in (first, run, second)] == ["prefill", "decode", "prefill"]
    a = run.attributes
    assert a[sc.STAGE] == sc.STAGE_ENGINE_FORWARD and run.parent is None
    assert a[sc.STEP_COUNT] == 3
    assert a[sc.STEP_TOKENS] == 5  # tokens decoded over the run
    assert a[sc.STEP_SEQUENCES] == 2 and tuple(a[sc.STEP_SESSION_IDS]) == (7, 8)  # its first step's
    assert a[sc.STEP_KV_TOKENS] == 41  # its last step's
    assert a[sc.STEP_SCHEDULE_SECONDS] > 0
    assert {link.context.span_id for link in run.links} == requests
    assert first.end_time <= run.start_time and run.end_time <= second.start_time
    # Back to back: the run starts from the first prefill's end reading and ends with the second's start reading.
    assert _read_times(run)[0] == _read_times(first)[1]
    assert _read_times(run)[1] == _read_times(second)[0]


def test_a_run_reads_torch_twice_whatever_its_length(traced, exporter, monkeypatch):
    reads = []
    read = traced.probe.read
    monkeypatch.setattr(traced.probe, "read", lambda: reads.append(1) or read())
    ScriptedEngine(traced, [decode([1, 2]) for _ in range(6)] + [IDLE]).run()
    (run,) = _steps(exporter)
    assert run.attributes[sc.STEP_COUNT] == 6
    assert len(reads) == 2  # the run's start and its end


def test_an_idle_poll_ends_the_run_at_the_end_of_the_step_in_flight(traced, exporter):
    """The engine prefetches the next batch while one runs; finding none, it goes idle after it."""
    engine = ScriptedEngine(traced, [decode([1]), decode([1]), IDLE, decode([1]), IDLE], prefetch_during={1})
    engine.run()
    early, late = _steps(exporter)
    assert early.attributes[sc.STEP_COUNT] == 2 and late.attributes[sc.STEP_COUNT] == 1
    assert early.end_time <= late.start_time


def test_an_idle_poll_while_the_last_batch_waits_for_the_agent_ends_the_run_after_it(traced, exporter):
    ScriptedEngine(traced, [decode([1]), decode([1]), IDLE, IDLE], prefetch_before={1}).run()
    (run,) = _steps(exporter)
    assert run.attributes[sc.STEP_COUNT] == 2


def test_an_idle_poll_after_the_last_step_ends_the_run_at_once(traced, exporter):
    ScriptedEngine(traced, [decode([1]), decode([1]), IDLE]).run()
    (run,) = _steps(exporter)
    assert run.attributes[sc.STEP_COUNT] == 2


def test_a_run_past_its_bound_ends_and_the_next_step_opens_a_new_one(traced, exporter, monkeypatch):
    monkeypatch.setattr(pytorch_decode_runs, "RUN_BOUND_NS", 0)  # every step is past it
    ScriptedEngine(traced, [decode([1]) for _ in range(3)] + [IDLE]).run()
    runs = _steps(exporter)
    assert [run.attributes[sc.STEP_COUNT] for run in runs] == [1, 1, 1]
    assert [_read_times(a)[1] for a in runs[:-1]] == [_read_times(b)[0] for b in runs[1:]]  # back to back


def test_a_failing_step_ends_its_run_with_the_error(traced, exporter):
    engine = ScriptedEngine(traced, [decode([1]), decode([1])])

    async def failing(**inputs):
        if engine.steps:
            raise RuntimeError("CUDA error: an illegal memory access")
        engine.steps += 1

    engine._model_forward = failing
    with pytest.raises(RuntimeError):
        engine.run()
    (run,) = _steps(exporter)
    assert run.attributes[sc.STEP_COUNT] == 2
    assert run.status.status_code == trace.StatusCode.ERROR


def test_uninstrument_ends_an_open_run(traced, exporter):
    ScriptedEngine(traced, [decode([1]), decode([1])]).run()
    assert sc.SPAN_PYTORCH_FORWARD not in spans_by_name(exporter)
    traced.close()
    (run,) = _steps(exporter)
    assert run.attributes[sc.STEP_COUNT] == 2


def test_a_run_open_at_an_abort_is_in_the_journal_with_its_start(tmp_path):
    child = start_python(os.path.join(HERE, "decode_run_abort_child.py"), str(tmp_path / "j"))
    try:
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGABRT, err
    (path,) = journal_files(tmp_path / "j")
    records, _ = read_journal_file(path)
    ended = {r["span_id"] for r in of_kind(records, "end")}
    (flying,) = [r for r in of_kind(records, "start") if r["span_id"] not in ended]
    assert flying["name"] == sc.SPAN_PYTORCH_FORWARD
    assert flying["attrs"][sc.STAGE] == sc.STAGE_ENGINE_FORWARD and flying["attrs"][sc.STEP_KIND] == "decode"
    assert sc.MEM_READ_TIME in flying["mem"] and sc.MEM_HOST_RSS in flying["mem"]  # its start reading


def test_a_step_runs_with_its_span_current_and_hands_the_engine_loop_its_context_back(traced, exporter):
    engine = ScriptedEngine(traced, [prefill([1]), decode([1]), decode([1]), IDLE])
    inside, after = [], []

    async def model_forward(**inputs):
        inside.append(trace.get_current_span().get_span_context().span_id)

    forward = engine._forward

    async def forward_then_look(*args):
        result = await forward(*args)
        after.append(trace.get_current_span().get_span_context().is_valid)
        return result

    engine._model_forward, engine._forward = model_forward, forward_then_look
    engine.run()
    first, run = _steps(exporter)
    assert inside == [first.context.span_id, run.context.span_id, run.context.span_id]
    assert after == [False, False, False]  # the engine loop's own context: no span current


def _decode_delta(session_ids: list[int], kv_tokens: int, block_offsets) -> dict:
    """A decode step as LMDeploy's inputs maker sends most: no ModelInputs, the delta from the step before."""
    delta = ModelInputsDelta(
        indices=None,
        block_offsets=block_offsets,
        indice_cpu=np.arange(len(session_ids)),
        max_q_seqlen=1,
        max_kv_seqlen=kv_tokens,
        sum_kv_seqlen=kv_tokens,
    )
    return {"inputs": None, "delta": delta, "running": _running(session_ids)}


def test_decode_steps_sent_as_deltas_are_one_run_with_their_counts(traced, exporter):
    """A delta's rows are its sequences; one without block offsets (the valid-only delta) counts as well."""
    steps = [
        _decode_delta([1, 2], 82, torch.zeros((2, 4), dtype=torch.long)),
        _decode_delta([1, 2], 84, torch.zeros((2, 4), dtype=torch.long)),
        _decode_delta([1, 2], 86, None),
    ]
    ScriptedEngine(traced, [*steps, IDLE]).run()
    (run,) = _steps(exporter)
    a = run.attributes
    assert a[sc.STEP_KIND] == "decode" and a[sc.STEP_COUNT] == 3
    assert a[sc.STEP_TOKENS] == 6 and a[sc.STEP_KV_TOKENS] == 86
    assert a[sc.STEP_SEQUENCES] == 2 and tuple(a[sc.STEP_SESSION_IDS]) == (1, 2)
