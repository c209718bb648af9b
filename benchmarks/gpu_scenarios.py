"""Scenarios with a known cause of memory growth, run instrumented on the tiny VLM on a real GPU.

    python benchmarks/gpu_scenarios.py --backend pytorch --out out/scenarios
    python benchmarks/gpu_scenarios.py --backend turbomind --out out/scenarios --only none,tensor
    python benchmarks/gpu_scenarios.py --backend turbomind --out out/scenarios --crash

Each scenario runs a few hundred requests (mixed image sizes, 1-4 image prompts per call) under
`vlmtrace.instrument()` with its own journal directory `OUT/<backend>-<scenario>/`, and injects one
cause at a known rate per request:

| scenario | cause | where |
| --- | --- | --- |
| none | nothing (steady state) | - |
| tensor | a tensor leak: a CUDA tensor of RATE bytes kept per image | vision preprocessing |
| cache | cache retention: RATE bytes allocated and freed in a private torch memory pool per image, the pool kept (as CUDA graphs keep theirs), so torch reserves more while allocated returns | vision preprocessing |
| native | growth outside torch: RATE bytes per request taken with cudaMalloc directly | the engine (TurboMind stream start / PyTorch prefill step) |
| host | a host leak: RATE bytes per request kept in a Python list | the engine (as above) |

`--onset-call N` arms the cause only from the N-th call on, and `--stop-call M` disarms it again from the
M-th call (a leak that begins after a deploy, one that stops); `--rate-mib R` replaces the table's rate.
`OUT/<backend>-<scenario>.json` says which request was the first and the last one armed, for a test to
check the analyzer's onset against.

`--crash` runs the batch-crash shape instead (40 image prompts, vision max_batch_size=1) and aborts the
process from another thread while generation is in flight; the journal must show what was in flight.
The injection patches LMDeploy before vlmtrace wraps it, so the injected work runs inside the span of
its stage. Needs the GPU set-up of benchmarks/gpu/README.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import threading
import time

import torch
from workload import BACKENDS, batches, build_pipeline, generation_config

import vlmtrace
from vlmtrace.export import fatal_signals
from vlmtrace.export.journal.stacks import FatalStacks

MiB = 1 << 20
# The cache rate is above 10 MiB: torch serves smaller blocks from shared 20 MiB segments, larger ones
# from a segment of their own (rounded to 2 MiB), so 12 MiB per image reserves exactly 12 MiB.
RATES = {"tensor": 4 * MiB, "cache": 12 * MiB, "native": 8 * MiB, "host": 4 * MiB}
SCENARIOS = ("none", "tensor", "cache", "native", "host")


class CudaMalloc:
    """Device memory from the CUDA runtime itself, invisible to torch's allocator."""

    def __init__(self) -> None:
        torch.cuda.init()
        self._runtime = self._load()
        self.pointers: list[ctypes.c_void_p] = []

    @staticmethod
    def _load():
        import glob

        candidates = glob.glob(
            os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*")
        )
        candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        for name in candidates:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
        raise OSError("no libcudart found")

    def take(self, size: int) -> None:
        pointer = ctypes.c_void_p()
        status = self._runtime.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size))
        if status != 0:
            raise RuntimeError(f"cudaMalloc returned {status}")
        self.pointers.append(pointer)

    def release(self) -> None:
        for pointer in self.pointers:
            self._runtime.cudaFree(pointer)
        self.pointers.clear()


class Injection:
    """Patches one LMDeploy method so that it does the scenario's damage, and undoes it."""

    def __init__(self, scenario: str, backend: str, rate: int | None = None) -> None:
        self.scenario = scenario
        self.backend = backend
        self.rate = RATES.get(scenario, 0) if rate is None else rate
        self.armed = True
        self.kept: list = []
        self.cuda = CudaMalloc() if scenario == "native" else None
        self._undo: list = []

    def _patch(self, owner, name, make):
        original = owner.__dict__[name]
        setattr(owner, name, make(original))
        self._undo.append((owner, name, original))

    def _damage(self, count: int) -> None:
        for _ in range(count if self.armed else 0):
            if self.scenario == "tensor":
                self.kept.append(torch.empty(self.rate, dtype=torch.uint8, device="cuda"))
            elif self.scenario == "cache":
                pool = torch.cuda.MemPool()
                with torch.cuda.use_mem_pool(pool):
                    scratch = torch.empty(self.rate, dtype=torch.uint8, device="cuda")
                    scratch.fill_(1)
                    del scratch
                self.kept.append(pool)
            elif self.scenario == "native":
                self.cuda.take(self.rate)
            elif self.scenario == "host":
                block = bytearray(self.rate)
                block[::4096] = b"\1" * len(block[::4096])
                self.kept.append(block)

    def install(self) -> None:
        if self.scenario in ("tensor", "cache"):
            from lmdeploy.vl.engine import ImageEncoder

            def make(original):
                async def preprocess(encoder, messages, *args, **kwargs):
                    images = sum(
                        1
                        for m in messages
                        if isinstance(m.get("content"), list)
                        for item in m["content"]
                        if isinstance(item, dict) and item.get("type") in ("image", "image_url", "image_data")
                    )
                    self._damage(images)
                    return await original(encoder, messages, *args, **kwargs)

                return preprocess

            self._patch(ImageEncoder, "preprocess", make)
        elif self.scenario in ("native", "host") and self.backend == "turbomind":
            from lmdeploy.turbomind.turbomind import TurboMindInstance

            def make(original):
                async def stream(instance, *args, **kwargs):
                    self._damage(1)
                    async for output in original(instance, *args, **kwargs):
                        yield output

                return stream

            self._patch(TurboMindInstance, "async_stream_infer", make)
        elif self.scenario in ("native", "host"):
            from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent

            def make(original):
                async def step(agent, *args, **kwargs):
                    inputs = kwargs.get("inputs")
                    if inputs is not None and not inputs.is_decoding:
                        self._damage(int(inputs.seq_length.shape[0]))
                    return await original(agent, *args, **kwargs)

                return step

            self._patch(BaseModelAgent, "_async_step", make)

    def remove(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self.kept.clear()
        if self.cuda is not None:
            self.cuda.release()
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def run_scenario(
    pipe,
    backend: str,
    scenario: str,
    out: str,
    calls: int,
    onset_call: int = 0,
    stop_call: int | None = None,
    rate: int | None = None,
) -> dict:
    injection = Injection(scenario, backend, rate)
    injection.install()
    journal = os.path.join(out, f"{backend}-{scenario}")
    session = vlmtrace.instrument(journal=journal, service_name=f"tiny-vlm-{backend}")
    gen = generation_config()
    prompts = 0
    armed: list[int] = []  # the 0-based request numbers the cause was armed for
    started = time.perf_counter()
    for call, batch in enumerate(batches(calls, seed=10 + SCENARIOS.index(scenario))):
        injection.armed = call >= onset_call and (stop_call is None or call < stop_call)
        pipe(batch.prompts(), gen_config=gen)
        if injection.armed:
            armed.extend(range(prompts, prompts + len(batch.sizes)))
        prompts += len(batch.sizes)
    seconds = time.perf_counter() - started
    time.sleep(0.35)  # samples after the last request
    vlmtrace.uninstrument()
    injection.remove()
    result = {
        "backend": backend,
        "scenario": scenario,
        "requests": prompts,
        "seconds": round(seconds, 2),
        "injected_bytes_per_request": injection.rate,
        "journal": journal,
        "probes": session.probe.status,
        "first_armed_request": armed[0] if armed else None,
        "last_armed_request": armed[-1] if armed else None,
    }
    with open(f"{journal}.json", "w") as f:
        json.dump(result, f, indent=1)
    return result


def run_crash(backend: str, out: str, keep_native_handlers: bool = False) -> None:
    """The batch-crash shape: 40 image prompts, vision max_batch_size=1; abort while the engine generates.
    `keep_native_handlers`: leave a fatal-signal handler that a library installed after faulthandler in
    front of it (the journal's re-arming patched out), to see what that library's handler does alone."""
    journal = os.path.join(out, f"{backend}-crash")
    if keep_native_handlers:
        FatalStacks.reclaim = lambda stacks: None
    session = vlmtrace.instrument(journal=journal, service_name=f"tiny-vlm-{backend}")
    pipe = build_pipeline(backend, vision_batch=1, max_batch_size=64)
    gen = generation_config(max_new_tokens=64)
    prompts = [p for batch in batches(40, seed=7, max_prompts=1) for p in batch.prompts()]
    pipe(prompts, gen_config=gen)
    started = time.perf_counter()
    pipe(prompts, gen_config=gen)
    round_seconds = time.perf_counter() - started

    def abort_when_busy() -> None:
        """Halfway through the round, as long as requests are generating (as TurboMind's abort would)."""
        time.sleep(round_seconds / 2)
        while not len(session.telemetry.requests):
            time.sleep(0.0005)
        print(
            json.dumps(
                {
                    "aborting": True,
                    "requests_generating": len(session.telemetry.requests),
                    "round_seconds": round(round_seconds, 3),
                    "t": time.time(),
                    "fatal_signal_handlers": fatal_signals.owners(fatal_signals.installed()),
                }
            ),
            flush=True,
        )
        os.abort()

    threading.Thread(target=abort_when_busy, name="abort-injector", daemon=True).start()
    pipe(prompts, gen_config=gen)
    print(json.dumps({"error": "the third round finished before the abort"}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--calls", type=int, default=96, help="pipeline calls per scenario (1-4 prompts each)")
    parser.add_argument("--onset-call", type=int, default=0, help="arm the cause from this call on (0-based)")
    parser.add_argument("--stop-call", type=int, default=None, help="disarm the cause from this call on")
    parser.add_argument("--rate-mib", type=float, default=None, help="bytes per image or request, in MiB")
    parser.add_argument("--crash", action="store_true")
    parser.add_argument(
        "--keep-native-handlers",
        action="store_true",
        help="with --crash: do not put faulthandler back in front of a library's fatal-signal handler",
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.crash:
        run_crash(args.backend, args.out, args.keep_native_handlers)
        return
    pipe = build_pipeline(args.backend)
    gen = generation_config()
    for batch in batches(4, seed=99):
        pipe(batch.prompts(), gen_config=gen)
    for scenario in args.only.split(","):
        rate = None if args.rate_mib is None else int(args.rate_mib * MiB)
        print(
            json.dumps(
                run_scenario(pipe, args.backend, scenario, args.out, args.calls, args.onset_call, args.stop_call, rate)
            ),
            flush=True,
        )
    pipe.close()


if __name__ == "__main__":
    main()
