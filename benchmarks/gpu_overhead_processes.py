"""End-to-end latency plain vs instrumented, one fresh process per arm: the cross-check of gpu_overhead.py.

    python benchmarks/gpu_overhead_processes.py --backend turbomind --pairs 8 --json processes-turbomind.json
    python benchmarks/gpu_overhead_processes.py --backend pytorch --model /tmp/q2b --pairs 8 --deadline 500

gpu_overhead.py interleaves the arms in one process, which resolves a few percent but could hide a cost
that only a fresh process pays, or one that `uninstrument()` leaves behind for the plain blocks after it.
Here every arm runs in its own process (this script's `child` command): it calls `vlmtrace.instrument()`
(defaults, journal in a temporary directory; `--variant` arms with other options, parsed as in
gpu_overhead.py; the `plain` arm not at all) before it builds the pipeline, as a user would, runs
`--warmup` untimed batches, then `--batches` timed ones, the same seeded batches in every process
(`--prompts-per-batch 1-4`: 1-4 image prompts each, the batches of gpu_overhead.py; `8`: eight each).
The processes run one after another, arms alternated, and the order within each pair alternates too
(plain-vlmtrace, vlmtrace-plain, ...; with more arms the order rotates). A pair's ratio is its
instrumented median batch latency over its plain one; the result is the median pair ratio with its
spread (min, max, interquartile range), the per-arm medians over processes, and for each instrumented
process vlmtrace's own CPU time inside span start and end, its memory reads per timed batch, and which
read of torch's allocator counters its timed batches took (`torch_counters`: "native" for the compiled
read, "python" for torch's statistics dict, "mixed" when the compiled read came in use during them,
null when torch's counters were not read; `torch_counters_state`, the compiled read's state after them;
the summary counts the processes of each path, "not read" for null). Every process also reports the CPU
per timed batch of LMDeploy's event-loop thread and of the whole process (gpu_overhead.py's), and each pair
what the arm added to plain's event loop (`event_loop_cpu_added_ms`, its spread in the summary).

A pair starts only if the slowest pair so far would still end before `--deadline` seconds from the
start; the JSON is rewritten after every pair, so a run cut short keeps what finished. `--resume`
continues the run in `--json` (same backend, model, arms and workload, or exit 2) up to `--pairs` pairs
in all, the arms' order alternating on from where it stopped: eight pairs of the 2B model (~95 s each)
take two device commands of 600 s. The first
process that fails (no result, or past `--process-timeout`) stops the run; its output's tail is in
the JSON. Exit status: 0 with at least one complete pair, 1 with none, 2 for bad arguments.
An arm's `preload:heap` (`--variant heap=preload:heap`) starts its processes with the heap counter
preloaded, as `vlmtrace run --heap-counter` does (probes/heap.py).
`--standin` runs the processes on a CPU with the stand-in TurboMind engine (plumbing only, no
measurement). The PyTorch engine spawns processes: everything here runs under `__main__`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

PLAIN = "plain"
PRELOAD = "preload"  # an arm option: what the arm's processes start with preloaded ("heap": the heap counter)


def prompt_counts(text: str) -> tuple[int, int]:
    """`1-4` → (1, 4): 1 to 4 prompts a batch, mixed; `8` → (8, 8). Only ranges from 1 are mixed
    (workload.batches draws 1..N)."""
    low, _, high = text.partition("-")
    try:
        counts = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or 1-N") from None
    if counts[0] < 1 or counts[1] < counts[0] or (counts[0] != counts[1] and counts[0] != 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not N or 1-N (N >= 1)")
    return counts


def parse_args() -> argparse.Namespace:
    from gpu_overhead import add_workload_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_arguments(parser)
    parser.add_argument("--pairs", type=int, default=8, help="processes per arm, alternated")
    parser.add_argument("--batches", type=int, default=60, help="timed batches per process")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches per process, after the build")
    parser.add_argument("--prompts-per-batch", type=prompt_counts, default=(1, 4), metavar="N|1-N")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--process-timeout", type=float, default=240, metavar="SECONDS")
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="no pair starts that the slowest pair so far says would end after this",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="add to the pairs already in --json (same run settings) until there are --pairs",
    )
    args = parser.parse_args()
    if args.resume and not (args.json and os.path.isfile(args.json)):
        parser.error("--resume needs --json PATH of an earlier run")
    if args.pairs < 1 or args.batches < 1 or args.warmup < 0:
        parser.error("--pairs and --batches must be at least 1, --warmup at least 0")
    if args.model and not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"--model {args.model}: no config.json there (build the 2B-shaped model first?)")
    return args


# The child: one arm in one fresh process.


def plan(count: int, prompts: tuple[int, int], seed: int = 1) -> list:
    """The seeded batches every process runs; 1-N prompts as in gpu_overhead.py (random seed 1), or N each."""
    from workload import Batch, batches

    low, high = prompts
    if low != high:
        return batches(count, seed=seed, max_prompts=high)
    images = [size for batch in batches(count * high, seed=seed, max_prompts=1) for size in batch.sizes]
    return [Batch(tuple(images[index * high : (index + 1) * high]), seed * 100_003 + index) for index in range(count)]


def torch_counter_path(session) -> str | None:
    """Which read of torch's counters the session's readings take now: "native" (the compiled read),
    "python" (torch's statistics dict), None (no session, or torch has not brought CUDA up)."""
    torch_probe = session.probe.torch_allocator if session is not None else None
    if torch_probe is None or not torch_probe.active():
        return None
    return "native" if torch_probe.native_state == "ready" else "python"


def child(config: dict) -> None:
    """Build, warm up, time; write the result to config['result'] before tearing anything down."""
    from gpu_overhead import CpuClocks, summarise, workload_engine
    from workload import build_pipeline, generation_config, timed

    import vlmtrace
    from vlmtrace.probes.heap import in_use_reader

    started = time.perf_counter()
    args = argparse.Namespace(model=config["model"], standin=config["standin"])
    options = config["options"]
    if options is not None:
        options = {
            key: value for key, value in options.items() if key != PRELOAD
        }  # the process's start, not instrument()'s
    with tempfile.TemporaryDirectory() as journal_dir, workload_engine(args):
        session = vlmtrace.instrument(**{"journal": journal_dir, **options}) if options is not None else None
        instrumented_s = time.perf_counter() - started
        prompts = config["prompts_per_batch"]
        pipe = build_pipeline(config["backend"], max_batch_size=max(8, prompts[1]))
        built_s = time.perf_counter() - started
        gen = generation_config(config["max_new_tokens"])
        chosen = plan(config["batches"], prompts)
        for index in range(config["warmup"]):
            timed(pipe, chosen[index % len(chosen)], gen)
        counters = (session.probe.reads, session.probe.measurements, session.telemetry.self_ns) if session else None
        path_before = torch_counter_path(session)
        latencies = []
        clocks = CpuClocks(pipe)
        cpu_before = clocks.read()
        start = time.perf_counter()
        for batch in chosen:
            latencies.append(timed(pipe, batch, gen))
        busy = time.perf_counter() - start
        loop_cpu, process_cpu = (
            (after - before) * 1000 / len(chosen) for after, before in zip(clocks.read(), cpu_before)
        )
        result = {
            "arm": config["arm"],
            "pid": os.getpid(),
            "instrument_s": instrumented_s if session else None,
            "build_s": built_s,
            **summarise(latencies, sum(len(b.sizes) for b in chosen), busy),
            "event_loop_cpu_ms_per_batch": loop_cpu,
            "process_cpu_ms_per_batch": process_cpu,
            "latencies_ms": [round(seconds * 1000, 4) for seconds in latencies],
            "heap_counter": in_use_reader() is not None,
        }
        if session is not None:
            reads, measurements, self_ns = (
                after - before
                for after, before in zip(
                    (session.probe.reads, session.probe.measurements, session.telemetry.self_ns), counters
                )
            )
            result.update(
                memory_reads_per_batch=reads / len(chosen),
                memory_measurements_per_batch=measurements / len(chosen),
                span_start_end_ms_per_batch=self_ns / 1e6 / len(chosen),
            )
            path_after = torch_counter_path(session)
            result["torch_counters"] = path_after if path_before in (path_after, None) else "mixed"
            result["torch_counters_state"] = (
                session.probe.torch_allocator.native_state if session.probe.torch_allocator is not None else None
            )
        with open(config["result"] + ".part", "w") as handle:
            json.dump(result, handle)
        os.replace(config["result"] + ".part", config["result"])  # the parent sees all of it or nothing
        if session is not None:
            vlmtrace.uninstrument()
        pipe.close()


# The parent: processes in turn, pairs, ratios.


class Stopped(Exception):
    """The parent was told to stop (SIGTERM, e.g. from `timeout`): its running child is killed first."""


def _stop(signum, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


TEARDOWN_S = 30  # after its result is written, a child gets this long to exit: teardown is not measured


def wait_for(process: subprocess.Popen, result_path: str, timeout: float) -> int | str:
    """The child's exit status, or "timeout" (no result in time, or no exit within TEARDOWN_S of it)."""
    end = time.monotonic() + timeout
    measured = False
    while True:
        try:
            return process.wait(1.0)
        except subprocess.TimeoutExpired:
            if not measured and os.path.exists(result_path):
                measured = True
                end = min(end, time.monotonic() + TEARDOWN_S)
            if time.monotonic() > end:
                return "timeout"


def run_process(config: dict, timeout: float, work: str) -> dict:
    """One child, in its own session, so that killing it takes what it spawned along."""
    log_path = os.path.join(work, f"{config['index']}-{config['arm']}.log")
    config = {**config, "result": os.path.join(work, f"{config['index']}-{config['arm']}.json")}
    env = dict(os.environ)
    if (config["options"] or {}).get(PRELOAD) == "heap":
        from vlmtrace.probes.heap import library as build

        env["LD_PRELOAD"] = str(build())
    began = time.monotonic()
    with (
        open(log_path, "wb") as log,
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "child", json.dumps(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        ) as process,
    ):
        try:
            status = wait_for(process, config["result"], timeout)
        finally:  # also when the parent is told to stop; and a spawned process the child left behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    wall = time.monotonic() - began
    if os.path.exists(config["result"]):  # a child that hung or crashed in teardown still measured
        with open(config["result"]) as handle:
            return {**json.load(handle), "exit": status, "wall_s": wall}
    with open(log_path, "rb") as handle:
        tail = handle.read()[-3000:].decode(errors="replace")
    return {"arm": config["arm"], "exit": status, "wall_s": wall, "error": tail}


def spread(values: list[float]) -> dict[str, float]:
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "q1": quartiles[0],
        "q3": quartiles[2],
        "iqr": quartiles[2] - quartiles[0],
    }


# What makes two runs' pairs comparable (--resume); `machine` is left out: the same lent machine type
# may come back under another host name.
RUN_SETTINGS = ("backend", "model", "standin", "arms", "batches", "warmup", "prompts_per_batch", "max_new_tokens")
PER_PROCESS = (
    "median_ms",
    "p95_ms",
    "prompts_per_s",
    "build_s",
    "memory_reads_per_batch",
    "memory_measurements_per_batch",
    "span_start_end_ms_per_batch",
    "event_loop_cpu_ms_per_batch",
    "process_cpu_ms_per_batch",
)


def summary(pairs: list[dict], arms: dict) -> dict:
    result = {}
    for arm in arms:
        processes = [pair["processes"][arm] for pair in pairs]
        # (a run resumed from an older version of this script has pairs without the newer keys)
        result[arm] = {
            key: statistics.median(p[key] for p in processes) for key in PER_PROCESS if all(key in p for p in processes)
        }
        if arm != PLAIN:
            result[arm]["pair_ratio"] = spread([pair["ratios"][arm] for pair in pairs])
            if all(arm in pair.get("event_loop_cpu_added_ms", {}) for pair in pairs):
                result[arm]["event_loop_cpu_added_ms"] = spread(
                    [pair["event_loop_cpu_added_ms"][arm] for pair in pairs]
                )
            result[arm]["paired_batch_ratio"] = spread([pair["paired_batch_ratios"][arm] for pair in pairs])
            result[arm]["throughput_ratio"] = spread([pair["throughput_ratios"][arm] for pair in pairs])
            result[arm]["torch_counters"] = dict(
                collections.Counter(p.get("torch_counters") or "not read" for p in processes)
            )
    return result


def pair_result(index: int, order: list[str], processes: dict) -> dict:
    plain = processes[PLAIN]
    others = [arm for arm in order if arm != PLAIN]
    return {
        "index": index,
        "order": order,
        "processes": processes,
        "ratios": {arm: processes[arm]["median_ms"] / plain["median_ms"] for arm in others},
        # the same batch in both processes: the median of its latency ratios
        "paired_batch_ratios": {
            arm: statistics.median(t / p for t, p in zip(processes[arm]["latencies_ms"], plain["latencies_ms"]))
            for arm in others
        },
        "throughput_ratios": {arm: processes[arm]["prompts_per_s"] / plain["prompts_per_s"] for arm in others},
        # the CPU per batch of LMDeploy's event-loop thread, the arm's over plain's (gpu_overhead.CpuClocks)
        "event_loop_cpu_added_ms": {
            arm: processes[arm]["event_loop_cpu_ms_per_batch"] - plain["event_loop_cpu_ms_per_batch"] for arm in others
        },
    }


def print_pair(pair: dict) -> None:
    processes = pair["processes"]
    cells = [f"{arm} {processes[arm]['median_ms']:.2f} ms" for arm in pair["order"]]
    for arm, ratio in pair["ratios"].items():
        process = processes[arm]
        cells.append(
            f"{arm}/plain {ratio:.4f} (paired {pair['paired_batch_ratios'][arm]:.4f}, "
            f"{process['span_start_end_ms_per_batch']:.3f} ms vlmtrace CPU, "
            f"{process['memory_reads_per_batch']:.1f} reads per batch, "
            f"torch's counters: {process.get('torch_counters')})"
        )
    wall = sum(process["wall_s"] for process in processes.values())
    print(f"pair {pair['index']} [{' '.join(pair['order'])}, {wall:.0f} s]: " + "; ".join(cells), flush=True)


def parent(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _stop)
    started = time.monotonic()
    arms = {PLAIN: None, "vlmtrace": {}, **dict(args.variant)}
    names = list(arms)
    model = os.path.abspath(args.model) if args.model else os.environ.get("VLMTRACE_TINY_VLM")
    result = {
        "backend": args.backend,
        "model": model or "(tests/data/tiny-qwen2vl, stand-in)",
        "standin": args.standin,
        "machine": platform.node(),
        "arms": arms,
        "batches": args.batches,
        "warmup": args.warmup,
        "prompts_per_batch": list(args.prompts_per_batch),
        "max_new_tokens": args.max_new_tokens,
        "pairs": [],
        "failures": [],
        "stopped": None,
    }
    slowest = 0.0
    if args.resume:
        with open(args.json) as handle:
            earlier = json.load(handle)
        differ = [key for key in RUN_SETTINGS if earlier.get(key) != json.loads(json.dumps(result[key]))]
        if differ:
            print(f"--resume: {args.json} was run with other settings ({', '.join(differ)})", file=sys.stderr)
            return 2
        result["pairs"], result["failures"] = earlier["pairs"], earlier["failures"]
        result["resumed"] = [
            *earlier.get("resumed", []),
            {"pairs": len(earlier["pairs"]), "stopped": earlier["stopped"], "elapsed_s": earlier.get("elapsed_s")},
        ]
        slowest = max((sum(p["wall_s"] for p in pair["processes"].values()) for pair in earlier["pairs"]), default=0.0)

    def write() -> None:
        result["elapsed_s"] = time.monotonic() - started
        if result["pairs"]:
            result["summary"] = summary(result["pairs"], names)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(result, handle, indent=1)

    with tempfile.TemporaryDirectory() as work:
        try:
            for index in range(len(result["pairs"]), args.pairs):
                if args.deadline is not None and time.monotonic() - started + slowest > args.deadline:
                    result["stopped"] = f"deadline: pair {index} would end after {args.deadline:.0f} s"
                    break
                shift = index % len(names)
                order = names[shift:] + names[:shift]
                pair_started = time.monotonic()
                processes = {}
                for arm in order:
                    processes[arm] = run_process(
                        {
                            "index": index,
                            "arm": arm,
                            "options": arms[arm],
                            "backend": args.backend,
                            "model": args.model,
                            "standin": args.standin,
                            "batches": args.batches,
                            "warmup": args.warmup,
                            "prompts_per_batch": args.prompts_per_batch,
                            "max_new_tokens": args.max_new_tokens,
                        },
                        args.process_timeout,
                        work,
                    )
                    if "error" in processes[arm]:
                        result["failures"].append({"pair": index, **processes[arm]})
                        raise Stopped(f"pair {index}: the {arm} process failed (exit {processes[arm]['exit']})")
                slowest = max(slowest, time.monotonic() - pair_started)
                result["pairs"].append(pair_result(index, order, processes))
                print_pair(result["pairs"][-1])
                write()
        except Stopped as reason:
            result["stopped"] = str(reason)
    write()
    for failure in result["failures"]:
        print(
            f"pair {failure['pair']}, {failure['arm']}: exit {failure['exit']}; output ends:\n{failure['error']}",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {key: result[key] for key in ("backend", "model", "stopped", "elapsed_s", "summary") if key in result},
            indent=1,
        )
    )
    return 0 if result["pairs"] else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(json.loads(sys.argv[2]))
    else:
        sys.exit(parent(parse_args()))
