"""The TurboMind layer: one span per request stream, with the scheduler's state at both ends.

TurboMind batches and steps in C++, out of Python's sight; what Python can see is each request's
stream of outputs and `get_schedule_metrics()`. The sampler reads the scheduler off the request
path; a stream span carries the state of the latest sample at its start and at its end.
"""

from __future__ import annotations

import weakref
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


def _end_attributes(sampler: Sampler, chunks: int, tokens: int, status: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = dict(sampler.latest(SOURCE))
    attributes[sc.ENGINE_OUTPUT_CHUNKS] = chunks
    attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = tokens
    if status is not None:
        attributes[sc.ENGINE_STATUS] = getattr(status, "name", str(status))
    return attributes


def _sample_scheduler(sampler: Sampler, engine: Any) -> None:
    """Let the sampler read this engine's scheduler without keeping the engine alive."""
    engine_ref = weakref.ref(engine)

    def read() -> dict[str, Any]:
        current = engine_ref()
        return schedule_attributes(current) if current is not None else {}

    sampler.add_source(SOURCE, read)


def stream(telemetry: Telemetry, sampler: Sampler):
    """`TurboMindInstance.async_stream_infer(session_id, input_ids, ...)`, an async generator."""
    sampled: weakref.WeakSet = weakref.WeakSet()

    async def wrapper(wrapped, instance, args, kwargs):
        session_id = argument(args, kwargs, 0, "session_id")
        engine = getattr(instance, "tm_model", None)
        if engine is not None and engine not in sampled:
            sampled.add(engine)
            _sample_scheduler(sampler, engine)
        request = telemetry.requests.get(session_id)
        handle = telemetry.start(
            sc.SPAN_TURBOMIND_STREAM, sc.STAGE_ENGINE_STREAM,
            safe(_start_attributes, sampler, session_id, argument(args, kwargs, 1, "input_ids")),
            context=request.handle.context() if request is not None else None)
        outputs = wrapped(*args, **kwargs)
        chunks = tokens = 0
        status = None
        error = None
        try:
            async for output in outputs:
                chunks += 1
                tokens += len(getattr(output, "token_ids", None) or ())
                status = getattr(output, "status", status)
                yield output
        except BaseException as exc:
            error = exc
            raise
        finally:
            await outputs.aclose()
            handle.end(safe(_end_attributes, sampler, chunks, tokens, status), error=error)

    return wrapper
