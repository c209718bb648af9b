"""The request layer: one `chat {model}` span per generation (GenAI semantic conventions).

In 0.16+ the span opens in `AsyncEngine.preprocess` (prompt rendering and the vision encoder are
part of a request's cost) and closes when `AsyncEngine.generate` has streamed its last output.
Before 0.16, `generate(messages, session_id, …)` is the whole request, prompt processing included:
the span opens at its first step and closes with it, and the prompt processing inside
(`_get_prompt_input`, `MultimodalProcessor.get_prompt_input`) adds its duration to it. Prompt
processing has no span of its own (a span fewer per request took a fifth of the memory reads off the
TurboMind request path, docs/gpu.md): in 0.16+ it starts with the request, and one reading where
it ends (`PROMPT_END_KEYS`) lets the analyzer place growth in it all the same; one where the last
output reaches the caller (`RESPONSE_END_KEYS`) does the same for the request's work after the response.
Either way the open span lives in `Telemetry.requests` under its session id, where the engine
layer finds it. What the span says, at its start and its end, is read by request_attributes.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from opentelemetry import context as otel_context

from vlmtrace import semconv as sc
from vlmtrace.export.content_events import ContentEvents
from vlmtrace.instrumentation.inputs import argument, session_key
from vlmtrace.instrumentation.request_attributes import (
    captured_prompt,
    captured_text,
    config_attributes,
    event_prompt,
    finish_attributes,
    finish_reason,
    generation_attributes,
    model_name,
    output_messages,
    prompt_tokens,
    renamed,
    request_attributes,
    span_prompt,
    stream_attributes,
    whole_request_finish_attributes,
)
from vlmtrace.instrumentation.runtime import (
    NO_DETAIL_KEY,
    SESSION_KEY,
    RequestState,
    SpanHandle,
    Telemetry,
    Wrapper,
    safe,
    warn_once,
)

_log = logging.getLogger(__name__)


def preprocess(telemetry: Telemetry, events: ContentEvents | None) -> Wrapper:
    """`AsyncEngine.preprocess(messages, session_id, gen_config, ...)`: opens the request span, which
    is current while the prompt is processed (the vision spans are its children). A request that fails
    here ends here (`events`: as `generate`'s)."""

    async def wrapper(wrapped, instance, args, kwargs):
        messages = argument(args, kwargs, 0, "messages")
        session_id = session_key(argument(args, kwargs, 1, "session_id"))
        parent = telemetry.pipeline_contexts.pop(session_id)
        prompt = captured_prompt(telemetry, messages)
        attributes = safe(request_attributes, instance, session_id, messages, span_prompt(telemetry, prompt))
        detail = telemetry.detail is None or telemetry.detail.detailed()
        if detail:
            attributes.update(safe(config_attributes, argument(args, kwargs, 2, "gen_config")))
        else:
            attributes[sc.REQUEST_DETAIL_SKIPPED] = 1
        request = telemetry.start(
            f"{sc.SPAN_REQUEST_OPERATION} {model_name(instance)}", sc.STAGE_REQUEST, attributes, context=parent
        )
        telemetry.heap_stage(sc.STAGE_PROMPT)  # until the prompt's end, read below
        # The request's clock starts inside its span, so its time to first token never exceeds the span.
        started = time.monotonic_ns()
        token = otel_context.attach(_inside(request, detail))
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as error:
            request.end(error=error)
            _finished(telemetry, request, started, None, events, event_prompt(telemetry, prompt), None)
            raise
        finally:
            otel_context.detach(token)
        attributes = safe(generation_attributes, result)
        attributes[sc.REQUEST_PREPROCESS_DURATION] = (time.monotonic_ns() - started) / 1e9
        if detail:
            attributes.update(renamed(telemetry.probe.read().attributes, sc.PROMPT_END_KEYS))
        telemetry.heap_stage(sc.STAGE_REQUEST)
        request.set_attributes(attributes)
        telemetry.requests.put(
            session_id,
            RequestState(request, started, captured_text(telemetry), event_prompt(telemetry, prompt), detail),
        )
        return result

    return wrapper


def _inside(request: SpanHandle, detail: bool, context: otel_context.Context | None = None) -> otel_context.Context:
    """The context the request's own code runs in: its span current, and where it records no stage detail,
    NO_DETAIL_KEY set (the vision layer skips its spans there). `context`: the request span's, with more set."""
    inside = request.context() if context is None else context
    return inside if detail else otel_context.set_value(NO_DETAIL_KEY, True, inside)


def _response_end(telemetry: Telemetry, state: RequestState, output: Any) -> None:
    """At the last output (the one with a finish reason) a reading: what runs between it and the
    request's end is the request's own work after the response. Not where an engine stream span is
    open (TurboMind's, which ends with the request): the bracket would hold that span's end too, and
    the two could not be told apart (docs/analysis.md, "Where")."""
    if (
        state.response_end is None
        and state.stream is None
        and state.detail
        and getattr(output, "finish_reason", None) is not None
    ):
        state.response_end = telemetry.probe.read().attributes
        telemetry.heap_stage(sc.STAGE_RESPONSE)


def _output_seen(telemetry: Telemetry, state: RequestState) -> Callable[[Any], None]:
    """`state.saw` and `_response_end` for each output."""

    def seen(output: Any) -> None:
        state.saw(output)
        _response_end(telemetry, state, output)

    return seen


async def _outputs(
    telemetry: Telemetry, state: RequestState, outputs: Any, on_close: Callable[[BaseException | None], None]
) -> AsyncIterator[Any]:
    """The request's outputs, passed on; once the stream is closed (exhausted, failed, or closed early
    by its consumer: GeneratorExit), `on_close` gets the exception that ended it, if any.

    Per output it counts and keeps the newest (its token count and finish reason end the spans); the
    first output with a generated token marks the time to first token, read once. Only where response
    text is captured, or no engine stream span is open, does each output get a closer look (its text;
    `_response_end`)."""
    error = None
    chunks = 0
    last = None
    try:
        async for output in outputs:
            chunks += 1
            last = output
            if state.first_chunk_ns is None and getattr(output, "generate_token_len", None):
                state.first_chunk_ns = time.monotonic_ns()
            if (state.stream is None and state.detail) or state.output_text is not None:
                state.keep_text(output)
                _response_end(telemetry, state, output)
            yield output
    except BaseException as exc:
        error = exc
        raise
    finally:
        await outputs.aclose()
        state.chunks = chunks
        state.last = last
        on_close(error)


def _close(
    telemetry: Telemetry,
    session_id: Any,
    state: RequestState,
    error: BaseException | None,
    end_attributes: Callable[[RequestState], dict[str, Any]],
    events: ContentEvents | None,
) -> None:
    """End a request's engine stream and its span (once, whoever gets there first), hand the request to
    the metrics, which record it off the request path, and emit its content event (`events`: where the
    capture mode asks for events). A request LMDeploy ended with finish reason `error` without raising
    failed all the same: status ERROR, `error.type` `_OTHER`."""
    if telemetry.requests.pop(session_id) is not state:
        return
    if state.stream is not None:
        state.stream.end(safe(stream_attributes, state), error=error)
    attributes = safe(end_attributes, state)
    output = None
    if state.output_text is not None:  # content is captured
        output = output_messages(state, state.output_text)
        if telemetry.options.content_on_spans:
            attributes[sc.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(output).decode()
    failed = "finish reason error" if finish_reason(state) == "error" else None
    state.handle.end(attributes, error=error, failed=failed)
    _finished(telemetry, state.handle, state.start_ns, state.first_chunk_ns, events, state.input_messages, output)


def _finished(
    telemetry: Telemetry,
    handle: SpanHandle,
    start_ns: int,
    first_ns: int | None,
    events: ContentEvents | None,
    prompt: list[dict[str, Any]] | None,
    response: list[dict[str, Any]] | None,
) -> None:
    """A request whose span has ended: to the metrics, which record it off the request path, and, where
    events are asked for, its content event."""
    span = handle.span
    finished = telemetry.finished
    if finished is not None:
        finished.append(
            (span.attributes, start_ns, first_ns, time.monotonic_ns(), span.attributes.get(sc.ERROR_TYPE), span)
        )
    if events is not None:
        try:
            events.emit(span, prompt, response)
        except Exception as problem:  # noqa: BLE001 - an SDK's processor: its failure stays vlmtrace's
            warn_once(
                "content-event",
                "could not emit a GenAI content event (%s: %s)",
                type(problem).__name__,
                problem,
                logger=_log,
            )


def generate(telemetry: Telemetry, events: ContentEvents | None) -> Wrapper:
    """`AsyncEngine.generate(request, ...)`: an async generator; the request span ends with it. `events`:
    where requests' content events go (None: none asked for)."""

    def wrapper(wrapped, instance, args, kwargs):
        preprocessed = argument(args, kwargs, 0, "request")
        session_id = session_key(getattr(preprocessed, "session", None))
        outputs = wrapped(*args, **kwargs)
        state: RequestState | None = telemetry.requests.get(session_id)
        if state is None:
            return outputs
        state.handle.span.attributes[sc.GEN_AI_REQUEST_STREAM] = bool(
            argument(args, kwargs, 1, "stream_response", True)
        )
        return _outputs(
            telemetry,
            state,
            outputs,
            lambda error: _close(telemetry, session_id, state, error, finish_attributes, events),
        )

    return wrapper


def from_messages(telemetry: Telemetry, events: ContentEvents | None) -> Wrapper:
    """`AsyncEngine.generate(messages, session_id, gen_config, …)` where it is the whole request (`events`:
    as `generate`'s).

    An async generator function: the wrapper runs when the generator is created (where 0.4–0.6.4
    pipelines still are in the caller's context), the span opens when it first runs."""

    def wrapper(wrapped, instance, args, kwargs):
        session_id = session_key(argument(args, kwargs, 1, "session_id"))
        return _whole_request(
            telemetry,
            instance,
            wrapped(*args, **kwargs),
            session_id,
            argument(args, kwargs, 0, "messages"),
            argument(args, kwargs, 2, "gen_config"),
            otel_context.get_current(),
            events,
        )

    return wrapper


async def _whole_request(
    telemetry: Telemetry,
    engine: Any,
    outputs: Any,
    session_id: Any,
    messages: Any,
    gen_config: Any,
    creator_context: Any,
    events: ContentEvents | None,
) -> AsyncIterator[Any]:
    handed_over = telemetry.pipeline_contexts.pop(session_id)
    prompt = captured_prompt(telemetry, messages)
    attributes = safe(request_attributes, engine, session_id, messages, span_prompt(telemetry, prompt))
    detail = telemetry.detail is None or telemetry.detail.detailed()
    if detail:
        attributes.update(safe(config_attributes, gen_config))
    else:
        attributes[sc.REQUEST_DETAIL_SKIPPED] = 1
    handle = telemetry.start(
        f"{sc.SPAN_REQUEST_OPERATION} {model_name(engine)}",
        sc.STAGE_REQUEST,
        attributes,
        context=handed_over if handed_over is not None else creator_context,
    )
    state = RequestState(
        handle, captured_text=captured_text(telemetry), input_messages=event_prompt(telemetry, prompt), detail=detail
    )
    seen = _output_seen(telemetry, state)
    telemetry.requests.put(session_id, state)
    inside = _inside(handle, detail, otel_context.set_value(SESSION_KEY, session_id, handle.context()))
    error = None
    try:
        while True:
            token = otel_context.attach(inside)  # the engine's own code runs in the request span
            try:
                output = await outputs.__anext__()
            except StopAsyncIteration:
                break
            finally:
                otel_context.detach(token)
            seen(output)
            yield output
    except BaseException as exc:
        error = exc
        raise
    finally:
        await outputs.aclose()
        _close(telemetry, session_id, state, error, whole_request_finish_attributes, events)


def prompt_input(telemetry: Telemetry) -> Wrapper:
    """`_get_prompt_input(prompt, …)` / `MultimodalProcessor.get_prompt_input(prompt=…)`: the prompt
    processing (chat template, images, tokens) inside a whole-request `generate`; its duration and
    token count go on the request span."""

    async def wrapper(wrapped, instance, args, kwargs):
        started = time.monotonic_ns()
        result = await wrapped(*args, **kwargs)
        state = telemetry.request_in_context()
        if state is not None:
            attributes = safe(prompt_tokens, result)
            attributes[sc.REQUEST_PREPROCESS_DURATION] = (time.monotonic_ns() - started) / 1e9
            state.handle.set_attributes(attributes)
        return result

    return wrapper
