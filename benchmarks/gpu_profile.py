"""Where an instrumented pipeline's threads spend their time, sampled from outside the process.

    py-spy record -r 400 --threads --nonblocking -f raw -o OUT/traced.raw -- \\
        python3 benchmarks/gpu_profile.py run --backend turbomind --seconds 25
    python3 benchmarks/gpu_profile.py summarise OUT/traced.raw

`run` drives the tiny VLM instrumented with the defaults for a while (the overhead benchmark's
batches); py-spy (staged in .whl/ by benchmarks/gpu/stage.sh) samples every thread without pausing
it. `summarise` reads the collapsed stacks and counts, per thread, the busy samples and those whose
innermost vlmtrace frame is running vlmtrace's own work (no LMDeploy, transformers, torch or PIL frame
below it: the wrapped call itself is not ours), by function and line.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

WRAPPED_CODE = ("lmdeploy/", "transformers/", "torch/", "PIL/")


def run(backend: str, seconds: float, standin: bool) -> None:
    """`standin`: on a CPU, LMDeploy's pipeline on the stand-in TurboMind of tests/support (as gpu_overhead.py's)."""
    from gpu_overhead import workload_engine

    with workload_engine(argparse.Namespace(model=None, standin=standin)):
        _drive(backend, seconds)


def _drive(backend: str, seconds: float) -> None:
    from workload import batches, build_pipeline, generation_config, timed

    import vlmtrace

    pipe = build_pipeline(backend, max_batch_size=8)
    gen = generation_config()
    plan = batches(15, seed=1)
    for batch in plan * 2:
        timed(pipe, batch, gen)
    vlmtrace.instrument(journal=tempfile.mkdtemp())
    latencies = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        latencies.extend(timed(pipe, batch, gen) for batch in plan)
    latencies.sort()
    print(f"{len(latencies)} batches, median {latencies[len(latencies) // 2] * 1000:.2f} ms", flush=True)
    vlmtrace.uninstrument()
    pipe.close()


def _frame_name(frame: str) -> str:
    function, _, location = frame.partition(" (")
    return f"{function} {location.rstrip(')').split('vlmtrace/')[-1]}"


def summarise(path: str, top: int) -> None:
    busy: collections.Counter = collections.Counter()
    own_by_thread: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    with open(path) as raw:
        for line in raw:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            thread = frames[0].split(": ")[-1]
            busy[thread] += int(count)
            ours = [i for i, frame in enumerate(frames) if "(vlmtrace/" in frame or "/vlmtrace/" in frame]
            if not ours or any("<module>" in frames[i] for i in ours):
                continue  # not in vlmtrace, or importing it
            below = frames[ours[-1] + 1 :]
            if any(code in frame for frame in below for code in WRAPPED_CODE):
                continue
            own_by_thread[thread] += int(count)
            own[_frame_name(frames[ours[-1]])] += int(count)
    print(f"{'thread':32s} {'busy':>7s} {'vlmtrace':>9s}")
    for thread, samples in busy.most_common(8):
        print(f"{thread:32s} {samples:7d} {own_by_thread[thread]:9d} ({own_by_thread[thread] / samples:.1%})")
    print(f"\nvlmtrace's own work, innermost frame (of {sum(own.values())} samples):")
    for frame, samples in own.most_common(top):
        print(f"{samples:7d}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("--backend", choices=("turbomind", "pytorch"), default="turbomind")
    run_parser.add_argument("--seconds", type=float, default=25)
    run_parser.add_argument("--standin", action="store_true", help="CPU: the stand-in TurboMind engine (tests/support)")
    summary_parser = commands.add_parser("summarise")
    summary_parser.add_argument("raw")
    summary_parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    if args.command == "run":
        run(args.backend, args.seconds, args.standin)
    else:
        summarise(args.raw, args.top)


if __name__ == "__main__":
    main()
