"""The TurboMind layer: one span per request stream, with the scheduler's state at both ends.

TurboMind batches and steps in C++, out of Python's sight; what Python can see is each request's
stream of outputs and, where the release has it (0.10 on), `get_schedule_metrics()`. The
sampler reads the scheduler off the request path; a stream span carries the state of the latest
sample at its start and at its end.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import argument
from vlmtrace.instrumentation.runtime import Telemetry, safe
from vlmtrace.probes.sampler import Sampler


def schedule_attributes(engine: Any) -> dict[str, Any]:
    metrics = engine.get_schedule_metrics()
    return {
        sc.LMDEPLOY_TM_ACTIVE_SEQS: int(metrics.active_seqs),
        sc.LMDEPLOY_TM_WAITING_SEQS: int(metrics.waiting_seqs),
        sc.LMDEPLOY_TM_CACHE_USAGE: float(metrics.cache_usage),
        sc.LMDEPLOY_TM_SCHEDULER_TICK: int(metrics.scheduler_tick),
    }


SOURCE = "turbomind"


def _start_attributes(sampler: Sampler, session_id: Any, input_ids: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = dict(sampler.latest(SOURCE))
    if isinstance(session_id, int):
        attributes[sc.LMDEPLOY_SESSION_ID] = session_id
    if input_ids is not None:
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = len(input_ids)
    return attributes


def _sample_scheduler(sampler: Sampler, engine: Any) -> None:
    """Let the sampler read this engine's scheduler without keeping the engine alive."""
    engine_ref = weakref.ref(engine)

    def read() -> dict[str, Any]:
        current = engine_ref()
        return schedule_attributes(current) if current is not None else {}

    sampler.add_source(SOURCE, read)


def stream(telemetry: Telemetry, sampler: Sampler) -> Callable[..., Any]:
    """`TurboMindInstance.async_stream_infer(session_id, input_ids, ...)` returns an async generator.

    The span opens when the request's generation asks for the stream, and the request layer, which
    iterates the outputs anyway, closes it with its counts: wrapping the generator itself would add
    a frame to every resumption of TurboMind's per-token wait."""
    sampled: weakref.WeakSet = weakref.WeakSet()

    def wrapper(wrapped, instance, args, kwargs):
        session_id = argument(args, kwargs, 0, "session_id")
        engine = getattr(instance, "tm_model", None)
        if engine is not None and hasattr(engine, "get_schedule_metrics") and engine not in sampled:
            sampled.add(engine)
            _sample_scheduler(sampler, engine)
        request = telemetry.requests.get(session_id)
        if request is not None and request.detail:
            request.stream = telemetry.start(
                sc.SPAN_TURBOMIND_STREAM,
                sc.STAGE_ENGINE_STREAM,
                safe(_start_attributes, sampler, session_id, argument(args, kwargs, 1, "input_ids")),
                context=request.handle,
            )
            request.stream_attributes = lambda: sampler.latest(SOURCE)
        return wrapped(*args, **kwargs)

    return wrapper
