"""vlmtrace's cost per PyTorch-engine step in instructions, which other jobs on a shared host do not move:
decode_steps_cpu.py's loop (LMDeploy's real scheduling code around a step that does nothing) run under
valgrind's callgrind, counting only the timed batches on the event-loop thread.

    PYTHONPATH=src:. python benchmarks/step_instructions.py --batches 100

Arms, one process each: `plain` (no vlmtrace), `call-through` (the three step methods wrapped by wrapt
wrappers that only call through: the wrapping alone) and `journal-only` (`instrument()`'s defaults). Prints
instructions a step per arm and each arm's excess over `plain`. Needs valgrind (callgrind_control on PATH);
~1 minute an arm.

`--check BASELINE` is CI's guard of a step's cost (tests/benchmarks/test_step_instructions.py): journal-only's
excess over `plain` may not exceed the baseline's by more than `--tolerance` (0.3), and may not fall below
half of it (a counting window that missed the step, or a gain the baseline should record: `--write-baseline`).
The count is the same on a loaded host; it moves only with the code, Python and the installed packages.

The batches of a phase run in one event loop (decode_steps_cpu.run_batches).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ARMS = ("plain", "call-through", "journal-only")
STEPS_PER_BATCH = 16


def _wait_for(path: str, text: str) -> None:
    while True:
        try:
            with open(path) as marker:
                if marker.read() == text:
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.1)


def _blocked_until_switched(marker: str, text: str, fifo: str) -> None:
    """Say `text`, then wait in the kernel (no instructions counted) until the parent has switched counting."""
    with open(marker, "w") as out:
        out.write(text)
    with open(fifo, "rb") as switched:
        switched.read(1)


def _through(*_):
    async def wrapper(wrapped, instance, args, kwargs):
        return await wrapped(*args, **kwargs)

    return wrapper


def _through_sync(*_):
    def wrapper(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    return wrapper


def child(arm: str, batches: int, marker: str, fifo: str) -> None:
    """The loop under callgrind: warm up, let the parent switch counting on, run the batches, and off."""
    from decode_steps_cpu import _batches, run_batches

    import vlmtrace
    from vlmtrace.instrumentation import pytorch_engine

    with tempfile.TemporaryDirectory() as journal:
        if arm == "plain":
            forward = lambda step, agent, args, kwargs: step(*args, **kwargs)
        else:
            if arm == "call-through":
                pytorch_engine.schedule, pytorch_engine.dispatch_to_agent = _through, _through_sync
                pytorch_engine.forward = _through
            session = vlmtrace.instrument(journal=journal)
            forward = pytorch_engine.forward(
                session.telemetry, session.step_queues, session.vit_hooks, session.decode_runs
            )
        run_batches(_batches(5, STEPS_PER_BATCH - 1), forward)
        timed = _batches(batches, STEPS_PER_BATCH - 1)
        _blocked_until_switched(marker, "ready", fifo)
        run_batches(timed, forward)
        _blocked_until_switched(marker, "done", fifo)


def measure(arm: str, batches: int, workdir: str) -> float:
    marker, output = os.path.join(workdir, f"{arm}.marker"), os.path.join(workdir, f"{arm}.callgrind")
    fifo = os.path.join(workdir, f"{arm}.fifo")
    os.mkfifo(fifo)
    process = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--separate-threads=yes",
            f"--callgrind-out-file={output}",
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            arm,
            "--batches",
            str(batches),
            "--marker",
            marker,
            "--fifo",
            fifo,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dict and set layouts in every run
    )
    for said, switch in (("ready", "on"), ("done", "off")):
        _wait_for(marker, said)
        subprocess.run(["callgrind_control", "-i", switch, str(process.pid)], check=True, capture_output=True)
        with open(fifo, "wb") as switched:
            switched.write(b"1")
    process.wait()
    with open(output + "-01") as main_thread:  # the event loop runs on the main thread
        totals = next(line for line in main_thread if line.startswith("totals:"))
    return int(totals.split()[1]) / (batches * STEPS_PER_BATCH)


def check(per_step: dict[str, float], baseline: dict, tolerance: float) -> list[str]:
    """Where journal-only's excess a step lies outside [half, 1 + tolerance] of the baseline's."""
    now, then = per_step["journal-only"] - per_step["plain"], baseline["journal-only_excess"]
    if now > then * (1 + tolerance):
        return [
            f"a step: vlmtrace adds {now / 1e3:.1f} k instructions, the baseline {then / 1e3:.1f} k "
            f"(+{tolerance:.0%} allowed)"
        ]
    if now < then / 2:
        return [
            f"a step: vlmtrace adds {now / 1e3:.1f} k instructions, under half the baseline's "
            f"{then / 1e3:.1f} k: the counting missed the step, or --write-baseline records a gain"
        ]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=100, help="timed batches (16 steps each)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument(
        "--check", metavar="BASELINE", help="exit 1 where a step's excess is out of the baseline's bounds"
    )
    parser.add_argument("--tolerance", type=float, default=0.3)
    parser.add_argument("--write-baseline", metavar="PATH")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--marker", help=argparse.SUPPRESS)
    parser.add_argument("--fifo", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batches, args.marker, args.fifo)
        return
    arms = [arm for arm in ARMS if arm in {"plain", *args.arms}]
    with tempfile.TemporaryDirectory() as workdir:
        per_step = {arm: measure(arm, args.batches, workdir) for arm in arms}
    for arm, instructions in per_step.items():
        print(
            f"{arm:14} {instructions / 1e3:8.1f} k instructions a step, +{(instructions - per_step['plain']) / 1e3:.1f} k"
        )
    if args.write_baseline:
        with open(args.write_baseline, "w") as out:
            json.dump(
                {
                    "command": " ".join(["python", *sys.argv]),
                    "date": time.strftime("%Y-%m-%d"),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
                    "plain": round(per_step["plain"]),
                    "journal-only_excess": round(per_step["journal-only"] - per_step["plain"]),
                },
                out,
                indent=1,
            )
            out.write("\n")
    if args.check:
        with open(args.check) as baseline:
            failures = check(per_step, json.load(baseline), args.tolerance)
        print("\n".join(failures) or "within the baseline's bounds")
        sys.exit(1 if failures else 0)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
