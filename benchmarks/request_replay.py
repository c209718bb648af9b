"""vlmtrace's own CPU per request, without LMDeploy's: one real request's wrapper calls, replayed.

    PYTHONPATH=src:. python benchmarks/request_replay.py [--mode infer|stream] [--without reads,journal,attributes]

One request goes through LMDeploy 0.18's real pipeline over the test suite's stand-in TurboMind engine
(one 224x224 image, 16 new tokens), with the arguments, results and outputs of the four calls vlmtrace
wraps on the event loop recorded (`AsyncEngine.preprocess`, `ImageEncoder.preprocess`,
`TurboMindInstance.async_stream_infer`, `AsyncEngine.generate`). The pipeline is closed; then vlmtrace's
wrappers (`instrument()`'s defaults: journal on, no SDK) run again and again over those recorded calls,
nested as LMDeploy nests them, in blocks that alternate with the same replay through wrappers that only
call through. Every span boundary takes a fresh memory reading (no reuse window: the replay's
boundaries are microseconds apart, a request's are not).

The figure is the difference of the two arms' *fastest* blocks, in µs of this thread's CPU per request:
vlmtrace's direct work, where `request_budget.py` measures everything a request costs the event loop
(its direct work, and what it does to LMDeploy's own code and threads around it) with a spread of
±100-200 µs on a shared host. `--without` answers each memory reading with the first one (`reads`),
turns the journal off (`journal`), or skips every attribute extraction (`attributes`).

What the same work costs at real requests' boundaries, part by part: `request_in_place.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import tempfile
import time

import wrapt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from request_budget import no_attributes, stand_in_pipeline
from tests.support.cpu_lmdeploy import cpu_lmdeploy

import vlmtrace
from vlmtrace.instrumentation import instrumentor, targets

RECORDED = {
    "preprocess": targets.REQUEST_PREPROCESS,
    "vision": targets.VISION_PREPROCESS,
    "stream": targets.TURBOMIND_STREAM,
    "generate": targets.REQUEST_GENERATE,
}


def record_one_request(mode: str) -> dict[str, tuple]:
    """(instance, args, kwargs, result or outputs) of each wrapped call of one real request."""
    calls: dict[str, tuple] = {}

    def awaited(name):
        async def wrapper(wrapped, instance, args, kwargs):
            calls[name] = (instance, args, kwargs, await wrapped(*args, **kwargs))
            return calls[name][3]

        return wrapper

    def streamed(wrapped, instance, args, kwargs):
        outputs: list = []
        calls["generate"] = (instance, args, kwargs, outputs)

        async def run():
            async for output in wrapped(*args, **kwargs):
                outputs.append(output)
                yield output

        return run()

    def called(wrapped, instance, args, kwargs):
        calls["stream"] = (instance, args, kwargs, None)
        return wrapped(*args, **kwargs)

    with cpu_lmdeploy(token_seconds=0.001):
        from lmdeploy.serve.core.async_engine import AsyncEngine
        from lmdeploy.turbomind.turbomind import TurboMindInstance
        from lmdeploy.vl.engine import ImageEncoder

        originals = [
            (AsyncEngine, "preprocess"),
            (AsyncEngine, "generate"),
            (ImageEncoder, "preprocess"),
            (TurboMindInstance, "async_stream_infer"),
        ]
        saved = [owner.__dict__[name] for owner, name in originals]
        for (owner, name), wrapper in zip(originals, (awaited("preprocess"), streamed, awaited("vision"), called)):
            wrapt.wrap_function_wrapper(owner, name, wrapper)
        try:
            pipe, one = stand_in_pipeline()
            one(mode)
            pipe.close()
        finally:
            for (owner, name), original in zip(originals, saved):
                setattr(owner, name, original)
    return calls


def replay(calls: dict[str, tuple], wrappers: dict[str, object]):
    """One request through `wrappers`, LMDeploy's own work replaced by its recorded results."""
    encoder, vision_args, vision_kwargs, encoded = calls["vision"]
    engine, args, kwargs, preprocessed = calls["preprocess"]
    instance, stream_args, stream_kwargs, _ = calls["stream"]
    generator, generate_args, generate_kwargs, outputs = calls["generate"]

    async def encoded_images(*a, **k):
        return encoded

    async def preprocess(*a, **k):
        await wrappers["vision"](encoded_images, encoder, vision_args, vision_kwargs)
        return preprocessed

    async def no_outputs():
        return
        yield

    async def generate(*a, **k):
        wrappers["stream"](lambda *a, **k: no_outputs(), instance, stream_args, stream_kwargs)
        for output in outputs:
            yield output

    async def run():
        await wrappers["preprocess"](preprocess, engine, args, kwargs)
        async for _ in wrappers["generate"](generate, generator, generate_args, generate_kwargs):
            pass

    return run()


@contextlib.contextmanager
def without(parts: set[str], session):
    if "reads" in parts:
        first = session.telemetry.probe.read()
        session.telemetry.probe.read = lambda: first
    if "journal" in parts:
        session.telemetry.recorder._journal = None
    with no_attributes() if "attributes" in parts else contextlib.nullcontext():
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("infer", "stream"), default="infer")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--requests", type=int, default=200, help="requests per block")
    parser.add_argument("--without", default="", help="comma-separated: reads, journal, attributes")
    args = parser.parse_args()
    calls = record_one_request(args.mode)
    session = vlmtrace.instrument(journal=tempfile.mkdtemp())
    session.telemetry.probe._reuse_ns = 0
    factories = instrumentor._wrappers()
    ours = {name: factories[role](session) for name, role in RECORDED.items()}
    through = {name: (lambda wrapped, instance, a, k: wrapped(*a, **k)) for name in RECORDED}
    loop = asyncio.new_event_loop()

    def block(wrappers) -> float:
        async def many():
            for _ in range(args.requests):
                await replay(calls, wrappers)

        gc.collect()
        began = time.thread_time_ns()
        loop.run_until_complete(many())
        return (time.thread_time_ns() - began) / args.requests / 1e3

    with without({part for part in args.without.split(",") if part}, session):
        for _ in range(3):
            block(ours), block(through)
        fastest = {"vlmtrace": float("inf"), "call-through": float("inf")}
        for _ in range(args.blocks):
            fastest["call-through"] = min(fastest["call-through"], block(through))
            fastest["vlmtrace"] = min(fastest["vlmtrace"], block(ours))
    vlmtrace.uninstrument()
    print(
        f"{args.mode}{' without ' + args.without if args.without else ''}: vlmtrace's direct CPU "
        f"{fastest['vlmtrace'] - fastest['call-through']:.1f} µs a request "
        f"(fastest blocks of {args.blocks} x {args.requests}; call-through {fastest['call-through']:.1f} µs)"
    )


if __name__ == "__main__":
    main()
