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
layer finds it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from opentelemetry import context as otel_context

from vlmtrace import semconv as sc
from vlmtrace.config import NO_CONTENT
from vlmtrace.export.content_events import ContentEvents
from vlmtrace.instrumentation.inputs import (
    argument,
    image_facts,
    input_messages,
    session_key,
)
from vlmtrace.instrumentation.runtime import (
    SESSION_KEY,
    RequestState,
    SpanHandle,
    Telemetry,
    Wrapper,
    safe,
    warn_once,
)

_log = logging.getLogger(__name__)

MAX_CAPTURED_TEXT = 4096  # characters per captured text part, prompt and response alike


def model_name(engine: Any) -> str:
    name = getattr(engine, "model_name", None) or "model"
    return os.path.basename(str(name).rstrip("/")) or str(name)


def _backend(engine: Any) -> str | None:
    backend = getattr(engine, "backend", None)
    return backend if isinstance(backend, str) else None


def _request_attributes(
    engine: Any, session_id: Any, messages: Any, prompt: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """`prompt`: the captured prompt where it goes on the span (`gen_ai.input.messages`), else None."""
    attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.SPAN_REQUEST_OPERATION,
        sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_PROVIDER,
        sc.GEN_AI_REQUEST_MODEL: model_name(engine),
    }
    if isinstance(session_id, int):
        attributes[sc.LMDEPLOY_SESSION_ID] = session_id
    backend = _backend(engine)
    if backend:
        attributes[sc.LMDEPLOY_BACKEND] = backend
    images, sizes = image_facts(messages)
    if images:
        attributes[sc.REQUEST_IMAGES] = images
        if sizes:
            attributes[sc.REQUEST_IMAGE_PIXELS] = sum(w * h for w, h in sizes)
    if prompt is not None:
        attributes[sc.GEN_AI_INPUT_MESSAGES] = orjson.dumps(prompt).decode()
    return attributes


def _captured_prompt(telemetry: Telemetry, messages: Any) -> list[dict[str, Any]] | None:
    """The prompt as the GenAI conventions give it, where content is captured (on the span, in the event or
    both); None where it is not, or where it cannot be read (warned once)."""
    if telemetry.options.capture_content == NO_CONTENT:
        return None
    try:
        return input_messages(messages, MAX_CAPTURED_TEXT)
    except Exception as error:  # noqa: BLE001 - LMDeploy's messages move between releases: never raise into it
        warn_once(
            "extract:input_messages",
            "could not read a prompt's messages (%s: %s); it is not captured",
            type(error).__name__,
            error,
            logger=_log,
        )
        return None


def _config_attributes(config: Any) -> dict[str, Any]:
    """The sampling parameters of a GenerationConfig as the caller gave it (LMDeploy rewrites its own copy)."""
    attributes: dict[str, Any] = {}
    for key, field, kind in (
        (sc.GEN_AI_REQUEST_MAX_TOKENS, "max_new_tokens", int),
        (sc.GEN_AI_REQUEST_TEMPERATURE, "temperature", float),
        (sc.GEN_AI_REQUEST_TOP_P, "top_p", float),
        (sc.GEN_AI_REQUEST_TOP_K, "top_k", int),
        (sc.GEN_AI_REQUEST_SEED, "random_seed", int),
    ):
        value = getattr(config, field, None)
        if value is not None:
            attributes[key] = kind(value)
    stop = getattr(config, "stop_words", None)
    if stop:
        attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = [str(word) for word in stop]
    return attributes


def _generation_attributes(preprocessed: Any) -> dict[str, Any]:
    return {sc.GEN_AI_USAGE_INPUT_TOKENS: int(preprocessed.input_token_len)}


def preprocess(telemetry: Telemetry, events: ContentEvents | None) -> Wrapper:
    """`AsyncEngine.preprocess(messages, session_id, gen_config, ...)`: opens the request span, which
    is current while the prompt is processed (the vision spans are its children). A request that fails
    here ends here (`events`: as `generate`'s)."""

    async def wrapper(wrapped, instance, args, kwargs):
        messages = argument(args, kwargs, 0, "messages")
        session_id = session_key(argument(args, kwargs, 1, "session_id"))
        parent = telemetry.pipeline_contexts.pop(session_id)
        prompt = _captured_prompt(telemetry, messages)
        attributes = safe(_request_attributes, instance, session_id, messages, _span_prompt(telemetry, prompt))
        attributes.update(safe(_config_attributes, argument(args, kwargs, 2, "gen_config")))
        request = telemetry.start(
            f"{sc.SPAN_REQUEST_OPERATION} {model_name(instance)}", sc.STAGE_REQUEST, attributes, context=parent
        )
        telemetry.heap_stage(sc.STAGE_PROMPT)  # until the prompt's end, read below
        # The request's clock starts inside its span, so its time to first token never exceeds the span.
        started = time.monotonic_ns()
        token = otel_context.attach(request.context())
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as error:
            request.end(error=error)
            _finished(telemetry, request, started, None, events, _event_prompt(telemetry, prompt), None)
            raise
        finally:
            otel_context.detach(token)
        attributes = safe(_generation_attributes, result)
        attributes[sc.REQUEST_PREPROCESS_DURATION] = (time.monotonic_ns() - started) / 1e9
        attributes.update(_renamed(telemetry.probe.read().attributes, sc.PROMPT_END_KEYS))
        telemetry.heap_stage(sc.STAGE_REQUEST)
        request.set_attributes(attributes)
        telemetry.requests.put(
            session_id, RequestState(request, started, _captured_text(telemetry), _event_prompt(telemetry, prompt))
        )
        return result

    return wrapper


def _captured_text(telemetry: Telemetry) -> int:
    """How much response text a request keeps for `gen_ai.output.messages`: none unless capture is on."""
    return 0 if telemetry.options.capture_content == NO_CONTENT else MAX_CAPTURED_TEXT


def _span_prompt(telemetry: Telemetry, prompt: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The captured prompt where it goes on the request span."""
    return prompt if prompt is not None and telemetry.options.content_on_spans else None


def _event_prompt(telemetry: Telemetry, prompt: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """What the request keeps of its prompt for the content event: the prompt where events are asked for."""
    return prompt if prompt is not None and telemetry.options.content_in_events else None


def _renamed(reading: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """A reading's values under the names of one moment of the request (sc.PROMPT_END_KEYS, sc.RESPONSE_END_KEYS)."""
    return {name: reading[key] for key, name in names.items() if key in reading}


def _response_end(telemetry: Telemetry, state: RequestState, output: Any) -> None:
    """At the last output (the one with a finish reason) a reading: what runs between it and the
    request's end is the request's own work after the response. Not where an engine stream span is
    open (TurboMind's, which ends with the request): the bracket would hold that span's end too, and
    the two could not be told apart (docs/analysis.md, "Where")."""
    if state.response_end is None and state.stream is None and getattr(output, "finish_reason", None) is not None:
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
            if state.stream is None or state.output_text is not None:
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


def _finish_attributes(state: RequestState) -> dict[str, Any]:
    attributes: dict[str, Any] = {sc.REQUEST_OUTPUT_CHUNKS: state.chunks}
    if state.response_end is not None:
        attributes.update(_renamed(state.response_end, sc.RESPONSE_END_KEYS))
    model = state.handle.span.attributes.get(sc.GEN_AI_REQUEST_MODEL)
    if model is not None:  # LMDeploy answers with the model it was asked for (it serves one)
        attributes[sc.GEN_AI_RESPONSE_MODEL] = model
    if state.first_chunk_ns is not None:
        attributes[sc.REQUEST_TTFT] = (state.first_chunk_ns - state.start_ns) / 1e9
    last = state.last
    if last is not None:
        attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = int(last.generate_token_len)
        if last.finish_reason:
            attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [str(last.finish_reason)]
    return attributes


def _finish_reason(state: RequestState) -> str | None:
    reason = getattr(state.last, "finish_reason", None)
    return str(reason) if reason else None


def _output_messages(state: RequestState, text: list[str]) -> list[dict[str, Any]]:
    """The response as the GenAI conventions give it (`gen_ai.output.messages`), from its text kept."""
    return [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "".join(text)}],
            "finish_reason": _finish_reason(state),
        }
    ]


def _stream_attributes(state: RequestState) -> dict[str, Any]:
    attributes: dict[str, Any] = dict(state.stream_attributes()) if state.stream_attributes else {}
    attributes[sc.ENGINE_OUTPUT_CHUNKS] = state.chunks
    if state.last is not None:
        attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = int(state.last.generate_token_len)
    return attributes


def _whole_request_finish_attributes(state: RequestState) -> dict[str, Any]:
    attributes = _finish_attributes(state)
    input_tokens = getattr(state.last, "input_token_len", None)
    if isinstance(input_tokens, int) and input_tokens >= 0:
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    return attributes


def _close(
    telemetry: Telemetry,
    session_id: Any,
    state: RequestState,
    error: BaseException | None,
    finish_attributes: Callable[[RequestState], dict[str, Any]],
    events: ContentEvents | None,
) -> None:
    """End a request's engine stream and its span (once, whoever gets there first), hand the request to
    the metrics, which record it off the request path, and emit its content event (`events`: where the
    capture mode asks for events). A request LMDeploy ended with finish reason `error` without raising
    failed all the same: status ERROR, `error.type` `_OTHER`."""
    if telemetry.requests.pop(session_id) is not state:
        return
    if state.stream is not None:
        state.stream.end(safe(_stream_attributes, state), error=error)
    attributes = safe(finish_attributes, state)
    output = None
    if state.output_text is not None:  # content is captured
        output = _output_messages(state, state.output_text)
        if telemetry.options.content_on_spans:
            attributes[sc.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(output).decode()
    failed = "finish reason error" if _finish_reason(state) == "error" else None
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
            lambda error: _close(telemetry, session_id, state, error, _finish_attributes, events),
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
    prompt = _captured_prompt(telemetry, messages)
    attributes = safe(_request_attributes, engine, session_id, messages, _span_prompt(telemetry, prompt))
    attributes.update(safe(_config_attributes, gen_config))
    handle = telemetry.start(
        f"{sc.SPAN_REQUEST_OPERATION} {model_name(engine)}",
        sc.STAGE_REQUEST,
        attributes,
        context=handed_over if handed_over is not None else creator_context,
    )
    state = RequestState(
        handle, captured_text=_captured_text(telemetry), input_messages=_event_prompt(telemetry, prompt)
    )
    seen = _output_seen(telemetry, state)
    telemetry.requests.put(session_id, state)
    inside = otel_context.set_value(SESSION_KEY, session_id, handle.context())
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
        _close(telemetry, session_id, state, error, _whole_request_finish_attributes, events)


def prompt_input(telemetry: Telemetry) -> Wrapper:
    """`_get_prompt_input(prompt, …)` / `MultimodalProcessor.get_prompt_input(prompt=…)`: the prompt
    processing (chat template, images, tokens) inside a whole-request `generate`; its duration and
    token count go on the request span."""

    async def wrapper(wrapped, instance, args, kwargs):
        started = time.monotonic_ns()
        result = await wrapped(*args, **kwargs)
        state = telemetry.request_in_context()
        if state is not None:
            attributes = safe(_prompt_tokens, result)
            attributes[sc.REQUEST_PREPROCESS_DURATION] = (time.monotonic_ns() - started) / 1e9
            state.handle.set_attributes(attributes)
        return result

    return wrapper


def _prompt_tokens(result: Any) -> dict[str, Any]:
    return {sc.GEN_AI_USAGE_INPUT_TOKENS: len(result["input_ids"])}
