"""What a request span says (GenAI semantic conventions): at its start the model, the session, the images
and the sampling parameters the caller gave; at its end the tokens, the finish reason and the time to first
token; and, where content is captured, the prompt and the response as GenAI messages, on the span, in the
content event, or both. request.py opens and closes the span; these read LMDeploy's objects for it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import orjson

from vlmtrace import semconv as sc
from vlmtrace.config import NO_CONTENT
from vlmtrace.instrumentation.inputs import image_facts, input_messages
from vlmtrace.instrumentation.runtime import RequestState, Telemetry, warn_once

_log = logging.getLogger(__name__)

MAX_CAPTURED_TEXT = 4096  # characters per captured text part, prompt and response alike


def model_name(engine: Any) -> str:
    name = getattr(engine, "model_name", None) or "model"
    return os.path.basename(str(name).rstrip("/")) or str(name)


def _backend(engine: Any) -> str | None:
    backend = getattr(engine, "backend", None)
    return backend if isinstance(backend, str) else None


def request_attributes(
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


def captured_prompt(telemetry: Telemetry, messages: Any) -> list[dict[str, Any]] | None:
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


def config_attributes(config: Any) -> dict[str, Any]:
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


def generation_attributes(preprocessed: Any) -> dict[str, Any]:
    return {sc.GEN_AI_USAGE_INPUT_TOKENS: int(preprocessed.input_token_len)}


def captured_text(telemetry: Telemetry) -> int:
    """How much response text a request keeps for `gen_ai.output.messages`: none unless capture is on."""
    return 0 if telemetry.options.capture_content == NO_CONTENT else MAX_CAPTURED_TEXT


def span_prompt(telemetry: Telemetry, prompt: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The captured prompt where it goes on the request span."""
    return prompt if prompt is not None and telemetry.options.content_on_spans else None


def event_prompt(telemetry: Telemetry, prompt: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """What the request keeps of its prompt for the content event: the prompt where events are asked for."""
    return prompt if prompt is not None and telemetry.options.content_in_events else None


def renamed(reading: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """A reading's values under the names of one moment of the request (sc.PROMPT_END_KEYS, sc.RESPONSE_END_KEYS)."""
    return {name: reading[key] for key, name in names.items() if key in reading}


def finish_attributes(state: RequestState) -> dict[str, Any]:
    attributes: dict[str, Any] = {sc.REQUEST_OUTPUT_CHUNKS: state.chunks}
    if state.response_end is not None:
        attributes.update(renamed(state.response_end, sc.RESPONSE_END_KEYS))
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


def finish_reason(state: RequestState) -> str | None:
    reason = getattr(state.last, "finish_reason", None)
    return str(reason) if reason else None


def output_messages(state: RequestState, text: list[str]) -> list[dict[str, Any]]:
    """The response as the GenAI conventions give it (`gen_ai.output.messages`), from its text kept."""
    return [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "".join(text)}],
            "finish_reason": finish_reason(state),
        }
    ]


def stream_attributes(state: RequestState) -> dict[str, Any]:
    attributes: dict[str, Any] = dict(state.stream_attributes()) if state.stream_attributes else {}
    attributes[sc.ENGINE_OUTPUT_CHUNKS] = state.chunks
    if state.last is not None:
        attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = int(state.last.generate_token_len)
    return attributes


def whole_request_finish_attributes(state: RequestState) -> dict[str, Any]:
    attributes = finish_attributes(state)
    input_tokens = getattr(state.last, "input_token_len", None)
    if isinstance(input_tokens, int) and input_tokens >= 0:
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    return attributes


def prompt_tokens(result: Any) -> dict[str, Any]:
    return {sc.GEN_AI_USAGE_INPUT_TOKENS: len(result["input_ids"])}
