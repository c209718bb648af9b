"""What metrics and the serving integrations add, measured side by side in one process.

1. Request path. vlmtrace's real request wrappers (`AsyncEngine.preprocess` and `.generate`, around a
   stand-in engine streaming 8 outputs) run whole requests with metrics off and on, in interleaved
   rounds; each request is timed from the preprocess call to the end of its stream. With metrics on,
   the only added work on this path is one tuple appended to a bounded deque; the isolated append is
   timed too.
2. Off the request path. What the sampler thread (or a collection) spends turning a finished request
   into histogram and counter points, and one collection of every instrument with two GPUs' readings.
3. Serving, per HTTP request: the api_server's SERVER-span middleware around a trivial ASGI app, and
   carrying the request's context (the configured propagators' carrier) into the engine process (both sides of the RPC wrapper).

    PYTHONPATH=src:. python benchmarks/metrics_overhead.py [--rounds 60] [--requests-per-round 100]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import platform
import statistics
import tempfile
import time
import timeit
import types

from opentelemetry import propagate
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanKind

from vlmtrace import semconv as sc
from vlmtrace.config import Options
from vlmtrace.export.journal import JournalWriter
from vlmtrace.export.recorder import SpanRecorder
from vlmtrace.instrumentation import mp_engine, request, server
from vlmtrace.instrumentation.metrics import Metrics
from vlmtrace.instrumentation.runtime import RequestState, Telemetry
from vlmtrace.probes.memory import MemoryProbe

OUTPUT_CHUNKS = 8


class Engine:
    """What the request wrappers read of AsyncEngine: a model name and a backend."""

    model_name = "tiny-qwen2vl"
    backend = "turbomind"


def _messages() -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "describe"},
                {"type": "image", "image": types.SimpleNamespace(size=(448, 448))},
            ],
        }
    ]


async def _preprocess(messages, session_id, gen_config=None):
    return types.SimpleNamespace(input_token_len=300, session=session_id, gen_config=gen_config)


async def _generate(preprocessed, stream_response=True):
    for index in range(1, OUTPUT_CHUNKS + 1):
        yield types.SimpleNamespace(
            generate_token_len=index, finish_reason="length" if index == OUTPUT_CHUNKS else None
        )


def _gen_config():
    return types.SimpleNamespace(max_new_tokens=OUTPUT_CHUNKS, temperature=1.0, top_p=1.0, top_k=1)


async def _requests(telemetry: Telemetry, count: int, first_session: int, out: list[int]) -> None:
    preprocess = request.preprocess(telemetry, None)
    generate = request.generate(telemetry, None)
    engine = Engine()
    clock = time.perf_counter_ns
    for session_id in range(first_session, first_session + count):
        began = clock()
        preprocessed = await preprocess(_preprocess, engine, (_messages(), session_id, _gen_config()), {})
        async for _ in generate(_generate, engine, (preprocessed,), {}):
            pass
        out.append(clock() - began)


def _telemetry(journal_dir: str, with_metrics: bool) -> tuple[Telemetry, Metrics | None, JournalWriter]:
    writer = JournalWriter.open(journal_dir, max_bytes=64 << 20, max_files=2, resource={}, versions={})
    telemetry = Telemetry(SpanRecorder(writer, None), MemoryProbe(("host",)), Options())
    metrics = None
    if with_metrics:
        metrics = Metrics(
            MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False).get_meter("vlmtrace")
        )
        telemetry.finished = metrics.finished
    return telemetry, metrics, writer


def _percentile(values: list[int], fraction: float) -> float:
    return values[min(len(values) - 1, int(len(values) * fraction))]


def request_path(rounds: int, per_round: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        configurations = {
            name: _telemetry(os.path.join(scratch, name), name == "metrics on")
            for name in ("metrics off", "metrics on")
        }
        timings: dict[str, list[int]] = {name: [] for name in configurations}
        session = 0
        for telemetry, _, _ in configurations.values():  # warm-up
            asyncio.run(_requests(telemetry, per_round, session, []))
            session += per_round
        for round_index in range(rounds):
            order = list(configurations.items())
            order = order[round_index % 2 :] + order[: round_index % 2]
            gc.collect()
            for name, (telemetry, metrics, _) in order:
                asyncio.run(_requests(telemetry, per_round, session, timings[name]))
                session += per_round
                if metrics is not None:
                    metrics.drain()  # what the sampler thread does every 100 ms, outside the timed requests
        for _, _, writer in configurations.values():
            writer.close()
    print(
        f"1. request path: {rounds} rounds x {per_round} requests (preprocess + {OUTPUT_CHUNKS} outputs) "
        "per configuration, interleaved"
    )
    print(f"   {'configuration':<14}{'median us':>10}{'p99 us':>10}")
    medians = {}
    for name, values in timings.items():
        values.sort()
        medians[name] = statistics.median(values)
        print(f"   {name:<14}{medians[name] / 1e3:>10.1f}{_percentile(values, 0.99) / 1e3:>10.1f}")
    print(f"   difference of the medians: {(medians['metrics on'] - medians['metrics off']) / 1e3:+.2f} us")
    finished: collections.deque = collections.deque(maxlen=4096)
    attributes = {sc.GEN_AI_USAGE_OUTPUT_TOKENS: 8}
    state = types.SimpleNamespace(
        start_ns=1, first_chunk_ns=2, handle=types.SimpleNamespace(span=types.SimpleNamespace(attributes=attributes))
    )
    error = None
    statement = (
        "finished.append((state.handle.span.attributes, state.start_ns, state.first_chunk_ns, "
        "monotonic_ns(), type(error).__name__ if isinstance(error, Exception) else None))"
    )
    loops = 200_000
    seconds = min(
        timeit.repeat(
            statement,
            globals={"finished": finished, "state": state, "error": error, "monotonic_ns": time.monotonic_ns},
            number=loops,
            repeat=5,
        )
    )
    print(
        f"   the append alone (the request wrapper's whole addition), best of 5 x {loops}: "
        f"{seconds / loops * 1e9:.0f} ns"
    )


def off_the_request_path() -> None:
    from tests.support import fake_gpu

    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader], shutdown_on_exit=False).get_meter("vlmtrace"))
    attributes = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_REQUEST_MODEL: "tiny-qwen2vl",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 300,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 8,
        sc.REQUEST_IMAGES: 1,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"],
    }
    count = 20_000
    for _ in range(count):
        metrics.finished.append((attributes, 0, 30_000_000, 120_000_000, None))
    began = time.perf_counter_ns()
    metrics.drain()
    per_request = (time.perf_counter_ns() - began) / count
    with fake_gpu.two_gpus():
        probe = MemoryProbe()
        sample = dict(probe.sample().attributes)
        probe.close()
    sample[sc.SELF_SECONDS] = 1.5
    metrics.on_sample(0, sample)
    reader.get_metrics_data()  # first collection creates the data points
    collections_ns = []
    for _ in range(200):
        began = time.perf_counter_ns()
        reader.get_metrics_data()
        collections_ns.append(time.perf_counter_ns() - began)
    began = time.perf_counter_ns()
    for _ in range(10_000):
        metrics.on_sample(0, sample)
    idle_sample = (time.perf_counter_ns() - began) / 10_000
    print("2. off the request path (sampler thread / metric reader)")
    print(
        f"   recording one finished request (3 histogram points; counter increments summed per drain): "
        f"{per_request / 1e3:.1f} us"
    )
    print(f"   a 100 ms sample with no finished request (the sampler's sink): {idle_sample / 1e3:.2f} us")
    print(
        f"   one collection of all instruments, two GPUs: median {statistics.median(collections_ns) / 1e3:.0f} us "
        "(every OTEL_METRIC_EXPORT_INTERVAL, default 60 s)"
    )


def serving(count: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        telemetry, _, writer = _telemetry(scratch, False)

        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        traced = server.ServerSpans(app, lambda: telemetry, frozenset({"/v1/chat/completions"}))
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "scheme": "http",
            "headers": [(b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
            "server": ("127.0.0.1", 23333),
            "client": ("127.0.0.1", 5000),
        }

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            pass

        async def calls(handler, out):
            clock = time.perf_counter_ns
            for _ in range(count):
                began = clock()
                await handler(scope, receive, send)
                out.append(clock() - began)

        timings = {"bare app": [], "with SERVER span": []}
        for _ in range(5):
            asyncio.run(calls(app, timings["bare app"]))
            asyncio.run(calls(traced, timings["with SERVER span"]))
        medians = {name: statistics.median(values) for name, values in timings.items()}

        request_span = telemetry.start("chat tiny", sc.STAGE_REQUEST, kind=SpanKind.INTERNAL)
        telemetry.requests.put(1, RequestState(request_span))
        send_wrapper = mp_engine.send_context(telemetry)
        rpc = lambda session_id, **kwargs: None
        loops = 20_000
        bare = min(timeit.repeat(lambda: rpc(1, input_ids=[1]), number=loops, repeat=5)) / loops
        wrapped = (
            min(timeit.repeat(lambda: send_wrapper(rpc, None, (1,), {"input_ids": [1]}), number=loops, repeat=5))
            / loops
        )
        receive_wrapper = mp_engine.receive_context(telemetry)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=request_span.context())

        async def stream(*args, **kwargs):
            for _ in range(OUTPUT_CHUNKS):
                yield types.SimpleNamespace(token_ids=[1], status=None)

        async def streams(wrap, out):
            for session_id in range(count):
                began = time.perf_counter_ns()
                outputs = (
                    receive_wrapper(
                        stream, None, (), {"session_id": session_id, "input_ids": [1], mp_engine.CONTEXT_KWARG: carrier}
                    )
                    if wrap
                    else stream()
                )
                async for _ in outputs:
                    pass
                out.append(time.perf_counter_ns() - began)

        engine = {"bare stream": [], "with context": []}
        for _ in range(5):
            asyncio.run(streams(False, engine["bare stream"]))
            asyncio.run(streams(True, engine["with context"]))
        request_span.end()
        writer.close()
    print(f"3. serving, per request ({count} x 5 each)")
    print(
        f"   api_server SERVER span (traceparent extracted, span started and ended, journal): "
        f"{(medians['with SERVER span'] - medians['bare app']) / 1e3:+.1f} us over a bare ASGI app "
        f"({medians['bare app'] / 1e3:.1f} us)"
    )
    print(f"   the request's context into the RPC keyword arguments (server process): {(wrapped - bare) * 1e6:+.2f} us")
    print(
        f"   engine process: context taken off, lmdeploy.pytorch.stream span over {OUTPUT_CHUNKS} outputs: "
        f"{(statistics.median(engine['with context']) - statistics.median(engine['bare stream'])) / 1e3:+.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--requests-per-round", type=int, default=100)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    request_path(args.rounds, args.requests_per_round)
    off_the_request_path()
    serving(2000)


if __name__ == "__main__":
    main()
