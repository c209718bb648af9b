"""What passing a request's outputs on costs the event loop, per request of 17 outputs (16 tokens and
the last, with the finish reason), on TurboMind's path (an engine stream span open, no text captured).

    PYTHONPATH=src python benchmarks/output_relay.py

Arms, in one process, alternating, each the median of 7 blocks of 2000 requests (this thread's CPU):
  bare          the engine's async generator iterated directly (no vlmtrace)
  relay         runtime.relay with the request layer's per-output callback (the whole-request
                `generate` of LMDeploy before 0.16 passes its outputs on this way)
  request-loop  request._outputs, the 0.16+ `generate` wrapper's loop: it counts, keeps the newest
                output and reads the first token's time once
"""

from __future__ import annotations

import asyncio
import statistics
import time
from types import SimpleNamespace

from vlmtrace.instrumentation import request
from vlmtrace.instrumentation.runtime import RequestState, relay

OUTPUTS = [SimpleNamespace(generate_token_len=i + 1, finish_reason=None, response="x") for i in range(16)]
OUTPUTS.append(SimpleNamespace(generate_token_len=16, finish_reason="length", response=""))
TELEMETRY = SimpleNamespace()  # the probe is read only where no engine stream span is open


async def engine():
    for output in OUTPUTS:
        yield output


def state() -> RequestState:
    opened = RequestState(SimpleNamespace(), 0)
    opened.stream = SimpleNamespace()  # TurboMind's stream span
    return opened


def ignore(error: BaseException | None) -> None:
    return None


async def bare(n: int) -> None:
    for _ in range(n):
        state()
        async for _ in engine():
            pass


async def relayed(n: int) -> None:
    for _ in range(n):
        opened = state()
        async for _ in relay(engine(), request._output_seen(TELEMETRY, opened), ignore):
            pass


async def request_loop(n: int) -> None:
    for _ in range(n):
        async for _ in request._outputs(TELEMETRY, state(), engine(), ignore):
            pass


def per_request_us(arm, n: int = 2000) -> float:
    began = time.thread_time_ns()
    asyncio.run(arm(n))
    return (time.thread_time_ns() - began) / n / 1e3


def main() -> None:
    arms = {"bare": bare, "relay": relayed, "request-loop": request_loop}
    blocks: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(7):
        for name, arm in arms.items():
            blocks[name].append(per_request_us(arm))
    bare_us = statistics.median(blocks["bare"])
    for name, values in blocks.items():
        median = statistics.median(values)
        print(f"{name:13s} {median:6.1f} µs a request of {len(OUTPUTS)} outputs, {median - bare_us:+6.1f} over bare")


if __name__ == "__main__":
    main()
