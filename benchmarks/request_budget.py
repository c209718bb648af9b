"""vlmtrace's event-loop CPU per request and per engine step, on a CPU: the per-request budget.

    PYTHONPATH=src:. python benchmarks/request_budget.py --json request-budget.json
    PYTHONPATH=src:. python benchmarks/request_budget.py --short --check benchmarks/results/request_budget_baseline.json

Requests: LMDeploy 0.18's real pipeline over the test suite's stand-in TurboMind engine
(tests/support/cpu_lmdeploy.py), one 224x224 image and 16 new tokens per request, one request at a
time, through `pipe.infer` (the engine's outputs collected: two reach the caller) and through
`pipe.stream_infer` (one output per token). Engine steps: decode_steps_cpu.py's loop, LMDeploy's real
scheduling code (`InputsMakerAsync`, `BaseModelAgent.set_forward_inputs`) around a model step that
does nothing, one prefill and 15 decode steps per batch of 1-4 sequences.

Arms, in blocks whose order rotates every round, in one process (`instrument()` per block):
  plain          no vlmtrace
  background     `instrument()` with every target unwrapped again: its threads (sampler, journal) only
  call-through   every target wrapped by a wrapper that only calls through
  skeleton       vlmtrace's wrappers with no span, no memory read and no attribute extracted: their frames,
                 context hand-offs and per-request state only
  unrecorded     vlmtrace's wrappers, but no span recorded and no memory read
  no-reads       vlmtrace, every memory read answered by the block's first reading
  no-journal     vlmtrace without the journal
  journal-only   `instrument()`'s defaults: journal on, no SDK (the budget's arm)
  sdk-otlp       journal on, and an SDK provider exporting over OTLP/gRPC (BatchSpanProcessor) to a
                 local rotel collector (an in-memory exporter where rotel is not installed)
What is measured is the CPU time of LMDeploy's event-loop thread (its CPU clock: a shared machine's
other jobs move wall time, not this); an arm's cost is the median over rounds of its excess over
`plain` in the same round. Roles (µs of event-loop CPU per request):
  background     background - plain             the sampler's and the journal's threads taking the GIL
  call-through   call-through - background      wrapping LMDeploy's calls, before any work of ours
  skeleton       skeleton - call-through        the wrappers' own frames, context hand-offs, the output loop
  attributes     unrecorded - skeleton          attribute extraction (and the prompt's and response's readings)
  reads          journal-only - no-reads        memory readings at span boundaries
  journal        journal-only - no-journal      journal records built and queued on the request path
  records        the rest of journal-only       span objects, ids, recorder and end bookkeeping

`--short` is CI's form: `plain` and journal-only only, 45 rounds of 2 requests, 8 rounds of 30 batches.
`--check BASELINE` compares the guarded figure (a request, the rounds of both entry points pooled),
vlmtrace's excess over `plain` as a fraction of `plain` in the same run, with the baseline's, and exits 1
where it is over it by more than `--tolerance` (0.3): a run that fails is repeated (`--attempts`), and the
median over attempts decides. An engine step's cost is guarded in instructions (step_instructions.py).
`--sampled` adds an arm, `sampled`: journal-only with `detail_every=16`, past the young requests (one count
of requests across its blocks, from the first past them), so 1 in 16 of its requests records stage detail.
`--inject FRACTION` adds an arm, `injected`, that burns that fraction of the baseline's journal-only
excess on top of journal-only on every request (in µs of CPU, from this run's plain blocks), and the
check reports whether it caught it: a regression the guard must see.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import wrapt
from PIL import Image

import vlmtrace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpu_overhead import GcClock, added_per_batch
from tests.support.cpu_lmdeploy import cpu_lmdeploy, standin_pipeline

from vlmtrace.instrumentation import request, runtime, turbomind, vision

# The modules whose wrappers extract span attributes through their `safe`.
EXTRACTING_MODULES = (runtime, request, vision, turbomind)

REQUEST_ARMS = (
    "plain",
    "background",
    "call-through",
    "skeleton",
    "unrecorded",
    "no-reads",
    "no-journal",
    "journal-only",
    "sdk-otlp",
)
STEP_ARMS = ("plain", "journal-only", "sdk-otlp")
SHORT_REQUEST_ARMS = ("plain", "journal-only")
MODES = ("infer", "stream")
# The guarded figure: a request over both entry points (their rounds pooled; how vlmtrace's cost splits
# between `infer` and `stream_infer` shifts from one host to another by more than the guard's +30 %, their
# sum does not). An engine step's is guarded in instructions (step_instructions.py): as a fraction of a
# `plain` step of a few µs it moves from one host to another by more than +30 %.
GUARDED = (("requests", "pooled"),)
SAMPLED_EVERY = 16
sampled_seen = [0]  # the `sampled` arm's requests started, carried from block to block


def thread_cpu_clock(pipe) -> int:
    """The CPU clock of the pipeline's event-loop thread (Pipeline.internal_thread)."""
    return time.pthread_getcpuclockid(pipe.internal_thread.thread.ident)


def burn(us: float) -> None:
    """Spend `us` µs of this thread's CPU."""
    until = time.thread_time_ns() + int(us * 1000)
    while time.thread_time_ns() < until:
        pass


class Collector:
    """rotel-agent on a free loopback port, exporting nowhere; None where rotel is not installed."""

    def __init__(self, workdir: str) -> None:
        self.process = None
        self.kind = "in-memory"
        try:
            import rotel
        except ImportError:
            return
        binary = os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [
                binary,
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{self.port}",
                "--otlp-http-endpoint",
                "127.0.0.1:0",
                "--exporter",
                "blackhole",
                "--pid-file",
                os.path.join(workdir, "rotel.pid"),
                "--log-file",
                os.path.join(workdir, "rotel.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                self.kind = "otlp-grpc->rotel"
                return
            time.sleep(0.05)
        self.stop()

    def provider(self):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SimpleSpanProcessor,
        )
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        provider = TracerProvider(shutdown_on_exit=False)
        if self.process is None:
            provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
            return provider
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter,
        )

        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{self.port}", insecure=True))
        )
        return provider

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            process.wait(timeout=10)


@contextlib.contextmanager
def no_attributes():
    """Every attribute extraction of vlmtrace's wrappers answers with no attributes."""
    saved = [module.safe for module in EXTRACTING_MODULES]
    for module in EXTRACTING_MODULES:
        module.safe = lambda extract, *args: {}
    try:
        yield
    finally:
        for module, original in zip(EXTRACTING_MODULES, saved):
            module.safe = original


def _ablations():
    from gpu_ablation import null_wrappers, sampler_only, unrecorded

    @contextlib.contextmanager
    def no_reads(session):
        reading = session.probe.read()
        session.probe.read = lambda: reading
        yield

    @contextlib.contextmanager
    def skeleton(session):
        with unrecorded(None)(session), no_reads(session), no_attributes():
            yield

    return {
        "background": sampler_only,
        "call-through": null_wrappers,
        "skeleton": skeleton,
        "unrecorded": unrecorded(None),
        "no-reads": no_reads,
    }


@contextlib.contextmanager
def arm(name: str, journal: str, collector: Collector, inject_us: float = 0.0):
    """vlmtrace set up as the arm says for the block (nothing for `plain`); yields the session."""
    if name == "plain":
        yield None
        return
    options: dict[str, Any] = {"journal": None if name == "no-journal" else journal}
    provider = None
    if name == "sdk-otlp":
        provider = collector.provider()
        options["tracer_provider"] = provider
    if name == "sampled":
        options["detail_every"] = SAMPLED_EVERY
    session = vlmtrace.instrument(**options)
    detail = session.telemetry.detail if name == "sampled" else None
    if detail is not None:  # past the young requests, counting on from the previous block
        detail.young, detail.seen = 0, sampled_seen[0]
    patch = _ablations().get(name, lambda session: contextlib.nullcontext())
    try:
        with patch(session), injected(inject_us if name == "injected" else 0.0):
            yield session
    finally:
        if detail is not None:
            sampled_seen[0] = detail.seen
        vlmtrace.uninstrument()
        if provider is not None:
            provider.shutdown()


@contextlib.contextmanager
def injected(us: float):
    """`us` µs of CPU more on every request's event-loop path (over vlmtrace's own preprocess wrapper)."""
    if not us:
        yield
        return
    from lmdeploy.serve.core.async_engine import AsyncEngine

    original = AsyncEngine.__dict__["preprocess"]

    def slower(wrapped, instance, args, kwargs):
        burn(us)
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(AsyncEngine, "preprocess", slower)
    try:
        yield
    finally:
        AsyncEngine.preprocess = original


def excess(by_round: dict[str, list[float]], name: str) -> float:
    """The median over rounds of the arm's excess over plain in the same round."""
    return statistics.median(a - p for a, p in zip(by_round[name], by_round["plain"]))


def stand_in_pipeline():
    """The benchmark's pipeline (call inside `cpu_lmdeploy()`) and `one(mode)`, which runs one request,
    one 224x224 image and 16 new tokens, through `pipe.infer` ("infer") or `pipe.stream_infer`."""
    from lmdeploy import GenerationConfig

    pipe = standin_pipeline()
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (224, 224, 3), dtype=np.uint8))
    prompt = ("describe this image", image)
    gen = GenerationConfig(max_new_tokens=16, top_k=1)

    def one(mode: str) -> None:
        if mode == "infer":
            pipe.infer([prompt], gen_config=gen)
        else:
            for _ in pipe.stream_infer([prompt], gen_config=gen):
                pass

    return pipe, one


def measure_requests(args, arms: tuple[str, ...], collector: Collector, baseline: dict | None) -> dict:
    with cpu_lmdeploy(token_seconds=0.001):
        pipe, one = stand_in_pipeline()
        clock = thread_cpu_clock(pipe)
        collections_of = GcClock()

        def block(mode: str, name: str = "") -> float:
            """µs of event-loop CPU per request over one block (the garbage collections in it counted
            under `name`, whichever thread ran them)."""
            one(mode)  # warm-up: the first request after instrument() pays its start-up
            gc.collect()  # and instrument()'s own allocations are not collected on a measured request
            collections_of.arm = f"{mode}:{name}"
            began = time.clock_gettime_ns(clock)
            for _ in range(args.requests):
                one(mode)
            spent = time.clock_gettime_ns(clock) - began
            collections_of.arm = None
            return spent / args.requests / 1e3

        for mode in MODES:
            for _ in range(3):
                one(mode)
        inject_us = 0.0
        if args.inject and baseline is not None:
            plain = statistics.median(block("infer") for _ in range(3))
            inject_us = args.inject * baseline["requests"]["pooled"]["journal-only"] * plain
            arms = (*arms, "injected")
        results: dict[str, Any] = {}
        pooled: dict[str, list[float]] = {name: [] for name in arms}
        with tempfile.TemporaryDirectory() as journal:
            for mode in MODES:
                by_round: dict[str, list[float]] = {name: [] for name in arms}
                for round_index in range(args.rounds):
                    shift = round_index % len(arms)
                    for name in arms[shift:] + arms[:shift]:
                        with arm(name, journal, collector, inject_us):
                            by_round[name].append(block(mode, name))
                results[mode] = summary(by_round, args.requests)
                for name, values in by_round.items():
                    pooled[name].extend(values)
                for name, values in results[mode]["arms"].items():
                    requests = args.requests * args.rounds
                    values["gc_collections_per_request"] = round(
                        sum(collections_of.collections[(f"{mode}:{name}", generation)] for generation in range(3))
                        / requests,
                        3,
                    )
                    values["gc_us_per_request"] = round(collections_of.seconds[f"{mode}:{name}"] * 1e6 / requests, 1)
        pipe.close()
    results["pooled"] = summary(pooled, args.requests)
    results["injected_us_per_request"] = inject_us
    return results


def summary(by_round: dict[str, list[float]], per_block: int) -> dict:
    plain = statistics.median(by_round["plain"])
    arms = {}
    for name, values in by_round.items():
        arms[name] = {"cpu_us": round(statistics.median(values), 1)}
        if name != "plain":
            added = excess(by_round, name)
            interval = added_per_batch(dict(enumerate(values)), dict(enumerate(by_round["plain"])), 1000)
            arms[name].update(added_us=round(added, 1), added_fraction=round(added / plain, 4))
            if interval is not None:  # 95 % bootstrap interval of the median excess, over whole rounds
                arms[name]["added_us_interval_95"] = [round(v, 1) for v in interval["median_interval_95"]]
    roles = {}
    if {"background", "call-through", "skeleton", "unrecorded", "no-reads", "no-journal"} <= set(by_round):

        def between(arm: str, base: str) -> float:
            return statistics.median(a - b for a, b in zip(by_round[arm], by_round[base]))

        total = excess(by_round, "journal-only")
        background = excess(by_round, "background")
        through = between("call-through", "background")
        skeleton = between("skeleton", "call-through")
        attributes = between("unrecorded", "skeleton")
        reads = between("journal-only", "no-reads")
        journal = between("journal-only", "no-journal")
        roles = {
            "background": background,
            "call-through": through,
            "skeleton": skeleton,
            "attributes": attributes,
            "reads": reads,
            "journal": journal,
            "records": total - background - through - skeleton - attributes - reads - journal,
        }
        roles = {key: round(value, 1) for key, value in roles.items()}
    return {
        "per_block": per_block,
        "rounds": len(by_round["plain"]),
        "arms": arms,
        "roles_us": roles,
        "by_round_us": {name: [round(v, 1) for v in values] for name, values in by_round.items()},
    }


def measure_steps(args, arms: tuple[str, ...], collector: Collector) -> dict:

    from decode_steps_cpu import _batches, run_batches

    from vlmtrace.instrumentation import pytorch_engine

    steps_per_batch = 16
    by_round: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as journal:
        for round_index in range(args.step_rounds + 1):  # the first round warms up
            shift = round_index % len(arms)
            for name in arms[shift:] + arms[:shift]:
                batches = _batches(args.batches, steps_per_batch - 1)
                with arm(name, journal, collector) as session:
                    if session is None:
                        forward = lambda step, agent, a, kw: step(*a, **kw)
                    else:
                        forward = pytorch_engine.forward(
                            session.telemetry, session.step_queues, session.vit_hooks, session.decode_runs
                        )
                    began = time.thread_time_ns()
                    run_batches(batches, forward)
                    spent = time.thread_time_ns() - began
                if round_index:
                    by_round[name].append(spent / (args.batches * steps_per_batch) / 1e3)
    return {"decode": summary(by_round, args.batches * steps_per_batch)}


def check(runs: list[dict], baseline: dict, tolerance: float) -> tuple[list[str], dict]:
    """Regressions of the guarded figures (median over runs) beyond the baseline's by `tolerance`."""
    failures, seen = [], {}
    for part, key in GUARDED:
        now = statistics.median(run[part][key]["arms"]["journal-only"]["added_fraction"] for run in runs)
        allowed = baseline[part][key]["journal-only"] * (1 + tolerance)
        seen[f"{part}.{key}"] = {"added_fraction": now, "allowed": round(allowed, 4)}
        if now > allowed:
            failures.append(
                f"{part}.{key}: vlmtrace adds {now:.1%} of plain's event-loop CPU, "
                f"the baseline {baseline[part][key]['journal-only']:.1%} (+{tolerance:.0%} allowed)"
            )
    return failures, seen


def write_baseline(path: str, runs: list[dict], about: dict) -> None:
    """The guarded figures' medians over `runs`: what --check compares a later run with."""
    baseline: dict[str, Any] = {key: about[key] for key in ("command", "date", "machine", "load_average_at_end")}
    baseline["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    for part, key in GUARDED:
        figures = [run[part][key]["arms"]["journal-only"] for run in runs]
        baseline.setdefault(part, {})[key] = {
            "journal-only": round(statistics.median(f["added_fraction"] for f in figures), 4),
            "added_us": round(statistics.median(f["added_us"] for f in figures), 1),
        }
    with open(path, "w") as out:
        json.dump(baseline, out, indent=1)
        out.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60, help="blocks per arm")
    parser.add_argument(
        "--requests",
        type=int,
        default=2,
        help="timed requests per block (a request's CPU varies by ~15 %% with the engine thread's "
        "timing: many short blocks pair arms closer in time than few long ones)",
    )
    parser.add_argument("--batches", type=int, default=60, help="engine batches (16 steps each) per block")
    parser.add_argument("--step-rounds", type=int, default=16, help="blocks per arm of engine steps")
    parser.add_argument("--short", action="store_true", help="CI's form: plain and journal-only, fewer rounds")
    parser.add_argument("--check", metavar="BASELINE", help="exit 1 on a regression over this baseline")
    parser.add_argument("--tolerance", type=float, default=0.3)
    parser.add_argument(
        "--attempts",
        type=int,
        default=3,
        help="runs at most with --check (a run that passes ends it), runs with --write-baseline",
    )
    parser.add_argument("--inject", type=float, default=0.0, metavar="FRACTION")
    parser.add_argument("--sampled", action="store_true", help=f"add the arm `sampled` (detail_every={SAMPLED_EVERY})")
    parser.add_argument(
        "--part",
        choices=("all", "requests", "steps"),
        default="all",
        help="measure requests, engine steps, or both (--check needs requests)",
    )
    parser.add_argument(
        "--write-baseline", metavar="PATH", help="run --attempts times and write the guarded figures' medians here"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    baseline = None
    if args.check:
        with open(args.check) as handle:
            baseline = json.load(handle)
    request_arms = (SHORT_REQUEST_ARMS if args.short else REQUEST_ARMS) + (("sampled",) if args.sampled else ())
    step_arms = ("plain", "journal-only") if args.short else STEP_ARMS
    if args.short:
        args.rounds, args.step_rounds, args.batches = (
            min(args.rounds, 45),
            min(args.step_rounds, 8),
            min(args.batches, 30),
        )
    workdir = tempfile.mkdtemp()
    collector = Collector(workdir)
    runs: list[dict] = []
    try:
        while True:
            run = {}
            if args.part in ("all", "requests"):
                run["requests"] = measure_requests(args, request_arms, collector, baseline)
            if args.part in ("all", "steps"):
                run["steps"] = measure_steps(args, step_arms, collector)
            runs.append(run)
            if args.write_baseline:
                if len(runs) >= args.attempts:
                    break
                continue
            if baseline is None:
                break
            failures, seen = check(runs, baseline, args.tolerance)
            if not failures or len(runs) >= args.attempts:
                break
    finally:
        collector.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        "load_average_at_end": [round(load, 1) for load in os.getloadavg()],
        "sdk_exporter": collector.kind,
        "runs": runs,
    }
    status = 0
    if baseline is not None:
        result["check"] = {"failures": failures, "figures": seen}
        if args.inject:
            caught = [run["requests"]["pooled"]["arms"]["injected"]["added_fraction"] for run in runs]
            allowed = baseline["requests"]["pooled"]["journal-only"] * (1 + args.tolerance)
            result["check"]["injected_caught"] = statistics.median(caught) > allowed
        status = 1 if failures else 0
    if args.write_baseline:
        write_baseline(args.write_baseline, runs, result)
    text = json.dumps(result, indent=1)
    print(text if args.json is None else json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            out.write(text)
    for run in runs:
        for mode in (*MODES, "pooled") if "requests" in run else ():
            print_table(f"requests ({mode})", run["requests"][mode])
        if "steps" in run:
            print_table("engine steps (decode runs)", run["steps"]["decode"])
    sys.exit(status)


def print_table(title: str, part: dict) -> None:
    print(
        f"\n{title}: µs of event-loop CPU per {'step' if 'steps' in title else 'request'}, "
        f"median of {part['rounds']} rounds x {part['per_block']}"
    )
    for name, values in part["arms"].items():
        low, high = values.get("added_us_interval_95", ("", ""))
        print(
            f"  {name:14} {values['cpu_us']:9.1f}  added {values.get('added_us', 0):8.1f} [{low}, {high}]"
            f"  ({values.get('added_fraction', 0):.1%})"
            + (f"  gc {values['gc_us_per_request']} us" if "gc_us_per_request" in values else "")
        )
    if part["roles_us"]:
        print("  roles: " + ", ".join(f"{key} {value:.1f}" for key, value in part["roles_us"].items()))


if __name__ == "__main__":
    main()
