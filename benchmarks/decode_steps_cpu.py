"""vlmtrace's cost per PyTorch-engine step on a CPU: LMDeploy's real scheduling code
(`InputsMakerAsync._send_next_inputs_impl`, `BaseModelAgent.set_forward_inputs`) and vlmtrace's real
wrappers around a stand-in step function that does nothing, so what is timed is the wrappers.

    PYTHONPATH=src python benchmarks/decode_steps_cpu.py --rounds 10 --batches 200

A batch is one prefill step and `--decode-steps` decode steps of 1-4 sequences, then the engine's
idle poll, as `gpu_overhead.py`'s batches of 16 new tokens. Arms, in blocks that rotate: `plain` (the
same loop without vlmtrace), `vlmtrace` (decode runs), and gpu_ablation.py's `step-spans` and
`step-spans-every-read` (a span per decode step). Per arm: the median over blocks of the engine
thread's CPU time per step (`thread_time`: on a shared machine wall time moves with the other jobs),
the CPU added to `plain`, the wall time per step, vlmtrace's own CPU in span starts and ends per batch,
and its memory reads per batch. On a CPU a reading is the host's only (no torch counters): a GPU reading
costs more (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import types

import torch
from gpu_ablation import ABLATIONS
from lmdeploy.pytorch.engine.inputs_maker import InputsMakerAsync
from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent
from lmdeploy.pytorch.model_inputs import ModelInputs

import vlmtrace
from vlmtrace.instrumentation import pytorch_engine

ARMS = ("plain", "vlmtrace", "step-spans", "step-spans-every-read")


def _inputs(sequences: int, decoding: bool) -> ModelInputs:
    lengths = [1 if decoding else 300] * sequences
    return ModelInputs(
        input_ids=torch.zeros((1, sum(lengths)), dtype=torch.long),
        seq_length=torch.tensor(lengths),
        history_lengths=torch.zeros(sequences, dtype=torch.long),
        block_offsets=torch.zeros((sequences, 4), dtype=torch.long),
        is_decoding=decoding,
        num_ignored_history=torch.zeros(sequences, dtype=torch.long),
        max_q_seqlen=max(lengths),
        max_kv_seqlen=max(lengths),
        sum_kv_seqlen=sum(lengths),
    )


def _batches(count: int, decode_steps: int) -> list[list]:
    """Per batch, what the scheduler hands out at each poll: prefill, decode steps, then nothing."""
    batches = []
    for index in range(count):
        sequences = 1 + index % 4
        running = [types.SimpleNamespace(session_id=index * 4 + i, logical_blocks=[0, 0]) for i in range(sequences)]
        polls = [{"inputs": _inputs(sequences, False), "delta": None, "running": running}]
        polls += [{"inputs": _inputs(sequences, True), "delta": None, "running": running} for _ in range(decode_steps)]
        batches.append([*polls, None])
    return batches


async def _engine(polls: list, forward) -> None:
    agent = object.__new__(BaseModelAgent)
    agent._pre_in_que = asyncio.Queue()
    maker = object.__new__(InputsMakerAsync)
    maker.scheduler = types.SimpleNamespace(resume_completed_migrations=lambda: None, tick=lambda: None)

    async def forward_async(inputs):
        agent.set_forward_inputs(inputs)

    async def step(**inputs):  # the model's forward: nothing here
        pass

    maker.executor = types.SimpleNamespace(forward_async=forward_async)
    maker.do_prefill = lambda: True
    maker._make_forward_inputs = lambda prefill, enable_empty: polls.pop(0)
    while polls:
        forward_inputs, _ = await maker._send_next_inputs_impl()
        if forward_inputs is not None:
            await forward(step, agent, (), dict(agent._pre_in_que.get_nowait()))


def run_batches(batches: list[list], forward) -> None:
    """The batches one after another in one event loop, as LMDeploy's engine loop runs for the engine's life.
    An `asyncio.run()` a batch would also swap a SIGINT handler in and out where Python's own is in place,
    which `instrument()` replaces (export/process_end.py): only the arm without vlmtrace would pay for it."""

    async def one_loop() -> None:
        for polls in batches:
            await _engine(polls, forward)

    asyncio.run(one_loop())


@contextlib.contextmanager
def _arm(name: str, journal: str):
    if name == "plain":
        yield None, (lambda step, agent, args, kwargs: step(*args, **kwargs))
        return
    session = vlmtrace.instrument(journal=journal, sample_interval_ms=0, metrics=False)
    forward = pytorch_engine.forward(session.telemetry, session.step_queues, session.vit_hooks, session.decode_runs)
    patch = ABLATIONS[name][1] if name in ABLATIONS else contextlib.nullcontext
    try:
        with patch(session):
            yield session, forward
    finally:
        vlmtrace.uninstrument()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="blocks per arm")
    parser.add_argument("--batches", type=int, default=200, help="batches per block")
    parser.add_argument("--decode-steps", type=int, default=15)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    steps_per_batch = 1 + args.decode_steps
    per_step: dict[str, list[float]] = {arm: [] for arm in ARMS}
    wall_per_step: dict[str, list[float]] = {arm: [] for arm in ARMS}
    counts: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as journal:
        for round_index in range(args.rounds + 1):  # the first round warms up
            order = ARMS[round_index % len(ARMS) :] + ARMS[: round_index % len(ARMS)]
            for arm in order:
                batches = _batches(args.batches, args.decode_steps)
                with _arm(arm, journal) as (session, forward):
                    before = (
                        (session.probe.reads, session.probe.measurements, session.telemetry.self_ns)
                        if session
                        else None
                    )
                    began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
                    run_batches(batches, forward)
                    cpu, elapsed = time.thread_time_ns() - began_cpu, time.perf_counter_ns() - began
                    if round_index == 0:
                        continue
                    per_step[arm].append(cpu / (args.batches * steps_per_batch) / 1e3)
                    wall_per_step[arm].append(elapsed / (args.batches * steps_per_batch) / 1e3)
                    if session is not None:
                        reads, measured, self_ns = (
                            now - then
                            for now, then in zip(
                                (session.probe.reads, session.probe.measurements, session.telemetry.self_ns), before
                            )
                        )
                        counts[arm].append(
                            (reads / args.batches, measured / args.batches, self_ns / args.batches / 1e6)
                        )
    plain = statistics.median(per_step["plain"])
    results = {}
    for arm in ARMS:
        median = statistics.median(per_step[arm])
        result = {
            "cpu_us_per_step": round(median, 2),
            "added_cpu_us_per_step": round(median - plain, 2),
            "wall_us_per_step": round(statistics.median(wall_per_step[arm]), 2),
        }
        if counts[arm]:
            result.update(
                {
                    key: round(statistics.median(values), 3)
                    for key, values in zip(
                        ("memory_reads_per_batch", "memory_measurements_per_batch", "span_start_end_ms_per_batch"),
                        zip(*counts[arm]),
                    )
                }
            )
        results[arm] = result
        print(f"{arm:24} {json.dumps(result)}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"arguments": vars(args), "arms": results}, out, indent=1)


if __name__ == "__main__":
    main()
