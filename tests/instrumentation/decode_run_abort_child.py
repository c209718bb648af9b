"""A traced PyTorch engine that aborts inside the third decode step of a run.

Usage: decode_run_abort_child.py JOURNAL. The abort comes 10 ms after the step started, the journal's
time bound (docs/journal.md): the run's start record must be in the journal."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import vlmtrace
from vlmtrace.instrumentation import pytorch_engine, pytorch_steps

PROMISED_S = 0.010


class Agent:
    """The model agent as the forward wrapper sees it (no ViT to hook)."""


def main(journal: str) -> None:
    session = vlmtrace.instrument(journal=journal, sample_interval_ms=0)
    forward = pytorch_engine.forward(session.telemetry, session.step_queues, session.vit_hooks, session.decode_runs)
    agent = Agent()
    steps = []

    async def model_forward(**inputs):
        steps.append(1)
        if len(steps) == 3:
            time.sleep(PROMISED_S)
            os.abort()

    async def engine():
        for _ in range(3):
            step = pytorch_steps.StepInfo(time.time_ns())
            step.batch = ("decode", 1, 1, None)
            session.step_queues.queue(agent).append(step)
            await forward(model_forward, agent, (), {})

    asyncio.run(engine())


if __name__ == "__main__":
    main(sys.argv[1])
