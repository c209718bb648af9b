"""End-to-end latency of the tiny VLM pipeline with and without vlmtrace, in one process.

    python benchmarks/gpu_overhead.py --backend turbomind --json overhead-turbomind.json
    python benchmarks/gpu_overhead.py --backend pytorch --variant no-torch=probes:nvml+host

The same seeded batches (1-4 image prompts of mixed sizes) run in blocks, plain and instrumented
in turn (the order rotates every round, so drift cancels); the `vlmtrace` arm uses the defaults
(journal on, 100 ms samples, no OTLP endpoint), and each `--variant NAME=OPTION:VALUE[,...]` adds an
arm with other `instrument()` options, and `--memory-history` an arm without vlmtrace that records
torch's allocator history instead (`torch.cuda.memory._record_memory_history()`, the heavyweight
alternative on the PyTorch engine, whose memory torch allocates). Prints medians, p95, throughput and their ratios to the plain
arm, and beside each ratio vlmtrace's own cost per timed batch: its CPU time inside span start and end
(`span_start_end_ms_per_batch`, from the session's `telemetry.self_ns`) and its memory reads
(`memory_reads_per_batch`; `memory_measurements_per_batch` of them not reused); and, for every arm, the
CPU time per batch of LMDeploy's event-loop thread (`event_loop_cpu_ms_per_batch`: the thread every
request's Python runs on, so what an arm adds there is its whole cost on the latency's critical path,
wrapped code run differently included; `event_loop_cpu_added_ms_per_batch`: that excess over `plain`,
round by round, with its interval) and of the whole process. `--model DIR` measures
another model directory than $VLMTRACE_TINY_VLM (the 2B-shaped one: benchmarks/gpu/README.md).
Needs the GPU set-up of benchmarks/gpu/README.md; `--standin` runs it on a CPU instead, with
LMDeploy's real Python over the test suite's stand-in TurboMind engine (a proxy for iterating on
vlmtrace's request-path cost, not a measurement of LMDeploy).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time

from cache_guard_stats import Block, estimate
from workload import BACKENDS, batches, build_pipeline, generation_config, timed

import vlmtrace


def summarise(latencies: list[float], prompts: int, seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "batches": len(latencies),
        "median_ms": statistics.median(ordered) * 1000,
        "p95_ms": ordered[int(len(ordered) * 0.95)] * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
        "prompts_per_s": prompts / seconds,
    }


class CpuClocks:
    """CPU seconds of LMDeploy's event-loop thread (Pipeline.internal_thread, LMDeploy 0.10 and later)
    and of the whole process, read from another thread through the thread's CPU clock."""

    def __init__(self, pipe) -> None:
        thread = getattr(getattr(pipe, "internal_thread", None), "thread", None)
        self._loop_clock = time.pthread_getcpuclockid(thread.ident) if thread is not None else None

    def read(self) -> tuple[float, float]:
        loop = time.clock_gettime(self._loop_clock) if self._loop_clock is not None else float("nan")
        return loop, time.process_time()


def parse_variant(text: str) -> tuple[str, dict]:
    """`name=probes:nvml+host,journal:off` → ("name", {"probes": ("nvml", "host"), "journal": None})."""
    name, _, spec = text.partition("=")
    options: dict = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition(":")
        options[key] = (
            None
            if value == "off"
            else tuple(value.split("+"))
            if key == "probes"
            else int(value)
            if value.isdigit()
            else value
        )
    return name, options


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """What this benchmark and gpu_overhead_processes.py share: the engine, the model, the extra arms."""
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="model directory (default: $VLMTRACE_TINY_VLM, the tiny Qwen2-VL; or the 2B-shaped one)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        type=parse_variant,
        help="NAME=OPTION:VALUE[,...]: one more arm, instrument() with these options "
        "(e.g. nojournal=journal:off, hostonly=probes:host)",
    )
    parser.add_argument("--standin", action="store_true", help="CPU: stand-in TurboMind engine (tests/support)")
    parser.add_argument("--json", metavar="PATH")


def parse_args(description: str = __doc__.split("\n")[0], more=None) -> argparse.Namespace:
    """`more(parser)`: arguments of a script built on this one (gpu_ablation.py)."""
    parser = argparse.ArgumentParser(description=description)
    add_workload_arguments(parser)
    if more is not None:
        more(parser)
    parser.add_argument("--rounds", type=int, default=20, help="blocks per arm")
    parser.add_argument("--per-round", type=int, default=15, help="timed batches per block")
    parser.add_argument(
        "--resamples", type=int, default=2000, help="bootstrap resamples of whole rounds for the intervals (0: none)"
    )
    parser.add_argument(
        "--memory-history",
        action="store_true",
        help="add an arm with torch.cuda.memory._record_memory_history() instead of vlmtrace",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval(SECONDS) for every arm: how long a thread that wants the GIL "
        "waits for a busy one (Python's default 0.005)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed batches at the start of every block, in every arm: instrument() runs per block, "
        "and the first calls after it (wrapping, a new journal file) are not the steady state",
    )
    return parser.parse_args()


@contextlib.contextmanager
def workload_engine(args: argparse.Namespace):
    """Point workload.build_pipeline at `--model` (it reads VLMTRACE_TINY_VLM) and, with `--standin`,
    put the CPU stand-in under LMDeploy for the block."""
    if args.model:
        os.environ["VLMTRACE_TINY_VLM"] = os.path.abspath(args.model)
    if not args.standin:
        yield
        return
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tests.support.cpu_lmdeploy import cpu_lmdeploy, tiny_vlm_path

    os.environ.setdefault("VLMTRACE_TINY_VLM", tiny_vlm_path())
    with cpu_lmdeploy(token_seconds=0.0005):
        yield


def run(args: argparse.Namespace, ablations: dict | None = None) -> None:
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    with workload_engine(args):
        measure(args, ablations)


MEMORY_HISTORY = "record_memory_history"


class GcClock:
    """Python's garbage collections while an arm runs: count per generation and time spent. More
    objects allocated per request means more frequent collections, paid by whichever thread
    allocates when a threshold is crossed."""

    def __init__(self) -> None:
        self.arm: str | None = None
        self.seconds: collections.Counter = collections.Counter()
        self.collections: collections.Counter = collections.Counter()
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if self.arm is None:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[self.arm] += time.perf_counter() - self._started
            self.collections[(self.arm, info["generation"])] += 1


@contextlib.contextmanager
def arm_running(options: dict | str | None, journal_dir: str, patch=contextlib.nullcontext):
    """What the arm adds around its batches: nothing, vlmtrace (yields its session), or torch's history.
    `patch(session)`: a context manager that changes the live session for the arm (gpu_ablation.py)."""
    if options is None:
        yield None
    elif options is MEMORY_HISTORY:
        import torch

        torch.cuda.memory._record_memory_history(max_entries=100_000)
        try:
            yield None
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    else:
        session = vlmtrace.instrument(**{"journal": journal_dir, **options})
        await_native_counters(session)
        try:
            with patch(session):
                yield session
        finally:
            vlmtrace.uninstrument()


TORCH_COUNTERS: set[str] = set()  # the compiled read's states the blocks began with, for the result


def await_native_counters(session, timeout_s: float = 120) -> None:
    """Torch's compiled counter read is built on a background thread once CUDA is up (the first session
    compiles it, later ones load it): every block is measured with it ready, or given up."""
    torch_probe = session.probe.torch_allocator
    if torch_probe is None or not torch_probe.active() or torch_probe.native is None:
        return
    TORCH_COUNTERS.add(torch_probe.native.wait(timeout_s))


def in_ms(rounds: dict[int, list[float]]) -> list[list[float]]:
    """Every round's latencies, in round order, in milliseconds."""
    return [[value * 1000 for value in rounds[r]] for r in sorted(rounds)]


def blocks_against_plain(arm: dict[int, list[float]], plain: dict[int, list[float]], resamples: int) -> dict | None:
    """The arm's latency ratios to plain with their intervals; None with fewer than 4 rounds."""
    if len(arm) < 4 or resamples <= 0:
        return None
    as_blocks = lambda rounds: {r: Block(values, [False] * len(values)) for r, values in rounds.items()}
    return estimate(as_blocks(arm), as_blocks(plain), resamples, seed=1)


def added_per_batch(arm: dict[int, float], plain: dict[int, float], resamples: int, seed: int = 1) -> dict | None:
    """The arm's excess over plain in the same rounds (a per-batch figure of each round): the mean and the
    median over rounds, each with a 95 % bootstrap interval over whole rounds (one round with a collection
    or a neighbour's burst moves the mean, not the median); None with fewer than 4 rounds."""
    differences = [arm[r] - plain[r] for r in sorted(set(arm) & set(plain))]
    if len(differences) < 4 or resamples <= 0:
        return None
    draw = random.Random(seed)
    draws = [draw.choices(differences, k=len(differences)) for _ in range(resamples)]
    result = {}
    for name, statistic in (("mean", statistics.fmean), ("median", statistics.median)):
        ordered = sorted(map(statistic, draws))
        result[name] = statistic(differences)
        result[f"{name}_interval_95"] = [ordered[int(0.025 * resamples)], ordered[int(0.975 * resamples) - 1]]
    return result


def measure(args, ablations: dict | None = None) -> None:
    """`ablations`: arm name → (options, patch) for gpu_ablation.py."""
    pipe = build_pipeline(args.backend, max_batch_size=8)
    gen = generation_config()
    plan = batches(args.per_round, seed=1)
    for batch in plan * 2:
        timed(pipe, batch, gen)

    ablations = ablations or {}
    arms = {
        "plain": None,
        "vlmtrace": {},
        **dict(args.variant),
        **{name: options for name, (options, _) in ablations.items()},
    }
    if args.memory_history:
        arms[MEMORY_HISTORY] = MEMORY_HISTORY
    latencies: dict[str, list[float]] = {arm: [] for arm in arms}
    by_round: dict[str, dict[int, list[float]]] = {arm: {} for arm in arms}
    prompts = dict.fromkeys(arms, 0)
    busy = dict.fromkeys(arms, 0.0)
    clocks = CpuClocks(pipe)
    # CPU ms per timed batch, round by round: LMDeploy's event-loop thread, the whole process
    loop_cpu_by_round: dict[str, dict[int, float]] = {arm: {} for arm in arms}
    process_cpu_by_round: dict[str, dict[int, float]] = {arm: {} for arm in arms}
    readings = {arm: [0, 0, 0] for arm in arms}
    names = list(arms)
    gc_clock = GcClock()
    with tempfile.TemporaryDirectory() as journal_dir:
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for arm in names[shift:] + names[:shift]:
                patch = ablations[arm][1] if arm in ablations else contextlib.nullcontext
                with arm_running(arms[arm], journal_dir, patch) as session:
                    for batch in plan[-args.warmup :] if args.warmup else ():
                        timed(pipe, batch, gen)
                    if session is not None:  # count the timed batches' work only
                        readings[arm][0] -= session.probe.reads
                        readings[arm][1] -= session.probe.measurements
                        readings[arm][2] -= session.telemetry.self_ns
                    start = time.perf_counter()
                    cpu_start = clocks.read()
                    gc_clock.arm = arm
                    for batch in plan:
                        latencies[arm].append(timed(pipe, batch, gen))
                        prompts[arm] += len(batch.sizes)
                    by_round[arm][round_index] = latencies[arm][-len(plan) :]
                    gc_clock.arm = None
                    busy[arm] += time.perf_counter() - start
                    loop_spent, process_spent = (now - then for now, then in zip(clocks.read(), cpu_start))
                    loop_cpu_by_round[arm][round_index] = loop_spent * 1000 / len(plan)
                    process_cpu_by_round[arm][round_index] = process_spent * 1000 / len(plan)
                    if session is not None:
                        readings[arm][0] += session.probe.reads
                        readings[arm][1] += session.probe.measurements
                        readings[arm][2] += session.telemetry.self_ns
    pipe.close()

    def cpu_per_batch(arm: str) -> dict[str, float]:  # every round times the same batches
        return {
            "event_loop_cpu_ms_per_batch": statistics.fmean(loop_cpu_by_round[arm].values()),
            "process_cpu_ms_per_batch": statistics.fmean(process_cpu_by_round[arm].values()),
        }

    def loop_cpu_added(arm: str) -> dict | None:
        return added_per_batch(loop_cpu_by_round[arm], loop_cpu_by_round["plain"], args.resamples)

    def collections_per_batch(arm: str) -> dict[str, float]:
        return {
            f"gen{generation}": gc_clock.collections[(arm, generation)] / len(latencies[arm]) for generation in range(3)
        }

    plain = {
        **summarise(latencies["plain"], prompts["plain"], busy["plain"]),
        **cpu_per_batch("plain"),
        "gc_ms_per_batch": gc_clock.seconds["plain"] * 1000 / len(latencies["plain"]),
        "gc_collections_per_batch": collections_per_batch("plain"),
    }
    result = {
        "backend": args.backend,
        "model": os.environ["VLMTRACE_TINY_VLM"],
        "rounds": args.rounds,
        "per_round": args.per_round,
        "switch_interval_s": sys.getswitchinterval(),
        "torch_counters": sorted(TORCH_COUNTERS),
        "plain": plain,
    }
    for arm in names[1:]:
        traced = summarise(latencies[arm], prompts[arm], busy[arm])
        paired = [t / p for t, p in zip(latencies[arm], latencies["plain"])]
        result[arm] = {
            **traced,
            "options": arms[arm] if isinstance(arms[arm], str) else dict(arms[arm]),
            "median_ratio": traced["median_ms"] / plain["median_ms"],
            "p95_ratio": traced["p95_ms"] / plain["p95_ms"],
            "throughput_ratio": traced["prompts_per_s"] / plain["prompts_per_s"],
            "paired_median_ratio": statistics.median(paired),
            "memory_reads_per_batch": readings[arm][0] / traced["batches"],
            "memory_measurements_per_batch": readings[arm][1] / traced["batches"],
            "span_start_end_ms_per_batch": readings[arm][2] / 1e6 / traced["batches"],
            **cpu_per_batch(arm),
            "event_loop_cpu_added_ms_per_batch": loop_cpu_added(arm),
            "gc_ms_per_batch": gc_clock.seconds[arm] * 1000 / traced["batches"],
            "gc_collections_per_batch": collections_per_batch(arm),
            # the first timed batch of each block against plain's: what is left of instrument()'s start-up
            "first_batch_paired_median_ratio": statistics.median(paired[:: len(plan)]),
            # how sure the ratios are: 95 % bootstrap intervals over whole rounds (cache_guard_stats.py)
            "intervals": blocks_against_plain(by_round[arm], by_round["plain"], args.resamples),
            "latencies_by_round_ms": in_ms(by_round[arm]),
        }
    result["plain"]["latencies_by_round_ms"] = in_ms(by_round["plain"])
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    run(parse_args())
