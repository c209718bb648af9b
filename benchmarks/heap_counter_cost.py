"""What the heap counter's stage charges cost (probes/heap_counter.c, probes/heap.py): a span's start and
end telling the counter which stage the context works in, an asyncio task's step telling it the task's
stage (tasks of two stages taking turns), the sampler's read of the charges (and of what each stage kept, by
when it was allocated), and a large chunk's malloc and free, in a process with the counter preloaded and one
without, alternated. To compare two versions of the counter, run it under each one's `PYTHONPATH`.

    python benchmarks/heap_counter_cost.py [--pairs 5] [--json out.json]

Each process times each operation over `--calls` calls, five times, and keeps the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from vlmtrace.probes import heap

CHILD = """
import json, statistics, sys, time, timeit
calls = int(sys.argv[1])
def per_call(statement):
    return statistics.median(timeit.repeat(statement, number=calls, repeat=5)) / calls * 1e9
result = {"large_chunk_ns": per_call(lambda: bytearray(100_000)), "small_chunk_ns": per_call(lambda: bytearray(60_000))}
from vlmtrace.probes.heap import stage_tags
tags = stage_tags()
if tags is not None:
    result["span_pair_ns"] = per_call(lambda: tags.restore(tags.enter("engine.stream")))
    result["sample_read_ns"] = per_call(tags.read)
    if hasattr(tags, "survivors"):  # read every 10 s and at shutdown
        result["survivors_read_ns"] = per_call(tags.survivors)
    import asyncio
    async def steps(stage, count):
        tags.enter(stage)
        for _ in range(count):
            await asyncio.sleep(0)
    async def both():
        await asyncio.gather(*(steps(("engine.stream", "vision.preprocess")[index % 2], 2000) for index in range(20)))
    def task_step_ns():
        started = time.perf_counter()
        asyncio.run(both())
        return (time.perf_counter() - started) / (20 * 2000) * 1e9
    plain = statistics.median(task_step_ns() for _ in range(5))
    tags.carry_tasks()
    carried = statistics.median(task_step_ns() for _ in range(5))
    tags.stop_carrying_tasks()
    result["task_step_ns"], result["task_step_carried_ns"] = plain, carried
print(json.dumps(result))
"""


def _process(preload: str | None, calls: int) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(calls)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--json")
    args = parser.parse_args()
    library = str(heap.library())
    runs = {"counter": [], "plain": []}
    for _ in range(args.pairs):
        runs["counter"].append(_process(library, args.calls))
        runs["plain"].append(_process(None, args.calls))
    summary = {
        arm: {key: statistics.median(run[key] for run in arm_runs) for key in arm_runs[0]}
        for arm, arm_runs in runs.items()
    }
    for arm, values in summary.items():
        print(arm, " ".join(f"{key}={value:.0f}" for key, value in values.items()))
    if args.json:
        with open(args.json, "w") as output:
            json.dump({"pairs": args.pairs, "calls": args.calls, "runs": runs, "median": summary}, output, indent=1)


if __name__ == "__main__":
    main()
