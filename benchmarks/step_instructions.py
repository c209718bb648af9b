"""vlmtrace's cost per PyTorch-engine step in instructions, which other jobs on a shared host do not move:
decode_steps_cpu.py's loop (LMDeploy's real scheduling code around a step that does nothing) run under
valgrind's callgrind, counting only the timed batches on the event-loop thread.

    PYTHONPATH=src:. python benchmarks/step_instructions.py --batches 100

Arms, one process each: `plain` (no vlmtrace), `call-through` (the three step methods wrapped by wrapt
wrappers that only call through: the wrapping alone) and `journal-only` (`instrument()`'s defaults). Prints
instructions a step per arm and each arm's excess over `plain`. Needs valgrind (callgrind_control on PATH);
~1 minute an arm.

The batches of a phase run in one event loop (decode_steps_cpu.run_batches).
"""

from __future__ import annotations

import argparse
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=100, help="timed batches (16 steps each)")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--marker", help=argparse.SUPPRESS)
    parser.add_argument("--fifo", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batches, args.marker, args.fifo)
        return
    with tempfile.TemporaryDirectory() as workdir:
        per_step = {arm: measure(arm, args.batches, workdir) for arm in ARMS}
    for arm, instructions in per_step.items():
        print(
            f"{arm:14} {instructions / 1e3:8.1f} k instructions a step, +{(instructions - per_step['plain']) / 1e3:.1f} k"
        )


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
