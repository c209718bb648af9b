"""The pipeline layer: one span per `Pipeline.infer / stream_infer / chat` call (0.4–0.6.4: the
`AsyncEngine` the pipeline factory returns, `__call__ / batch_infer / stream_infer / chat`).

Since 0.12 the pipeline hands its requests to an event-loop thread of its own, where the caller's
OpenTelemetry context does not exist. The `_infer` wrapper therefore records, per session, the
context the call was made in; the request wrapper picks it up on the loop thread. Before, the
requests' generators are created in the calling context, where the request wrapper reads it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.inputs import argument, images_in_prompt, session_key, split_prompts
from vlmtrace.instrumentation.runtime import SpanHandle, Telemetry, safe

_inside_pipeline_call: contextvars.ContextVar[bool] = contextvars.ContextVar("vlmtrace_pipeline_call", default=False)


def _prompt_attributes(prompts: Any) -> dict[str, Any]:
    batch = split_prompts(prompts)
    return {sc.PIPELINE_PROMPTS: len(batch), sc.PIPELINE_IMAGES: sum(len(images_in_prompt(p)) for p in batch)}


def _ending_when_exhausted(results: Iterator[Any], handle: SpanHandle) -> Iterator[Any]:
    """A streaming call's span lasts until the caller has read (or dropped) the last output, and is
    current while the stream computes each one (0.4–0.6.4 start their requests there, lazily)."""
    error = None
    try:
        while True:
            token = otel_context.attach(handle.context())
            try:
                result = next(results)
            except StopIteration:
                break
            finally:
                otel_context.detach(token)
            yield result
    except BaseException as exc:
        error = exc
        raise
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()
        handle.end(error=error)


def pipeline_call(telemetry: Telemetry, span_name: str, prompt_arg: str, streams: bool) -> Callable[..., Any]:
    """`streams`: the call returns an iterator, and the span ends with it."""

    def wrapper(wrapped, instance, args, kwargs):
        if _inside_pipeline_call.get():
            return wrapped(*args, **kwargs)
        prompts = argument(args, kwargs, 0, prompt_arg)
        handle = telemetry.start(span_name, sc.STAGE_PIPELINE, safe(_prompt_attributes, prompts))
        flag = _inside_pipeline_call.set(True)
        token = otel_context.attach(handle.context())
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as error:
            handle.end(error=error)
            raise
        finally:  # a streaming call's span stays open: it ends with the stream, not with this call
            otel_context.detach(token)
            _inside_pipeline_call.reset(flag)
        if streams and isinstance(result, Iterator):
            return _ending_when_exhausted(result, handle)
        handle.end()
        return result

    return wrapper


def request_handoff(telemetry: Telemetry) -> Callable[..., Any]:
    """`Pipeline._infer(requests, ...)`: remember each request's calling context by session."""

    def wrapper(wrapped, instance, args, kwargs):
        caller_context = otel_context.get_current()
        requests = argument(args, kwargs, 0, "requests")

        def tagged(items):
            for request in items:
                if isinstance(request, dict) and "session_id" in request:
                    telemetry.pipeline_contexts.put(session_key(request["session_id"]), caller_context)
                yield request

        if "requests" in kwargs:
            kwargs = dict(kwargs, requests=tagged(requests))
        else:
            args = (tagged(requests), *args[1:])
        return wrapped(*args, **kwargs)

    return wrapper
