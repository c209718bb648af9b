"""LMDeploy 0.18's real pipeline, prompt processing and Qwen2-VL image preprocessing on the CPU, traced."""

from __future__ import annotations

import asyncio

from lmdeploy import GenerationConfig

from tests.instrumentation.conftest import finished, image, parent_of, spans_by_name
from vlmtrace import semconv as sc

GEN = GenerationConfig(max_new_tokens=6, top_k=1)


def test_batch_of_image_prompts_gives_one_parent_chain_per_request(traced, exporter, cpu_pipeline):
    sizes = [(120, 100), (300, 200), (64, 64)]
    outputs = cpu_pipeline([("describe this image", image(w, h, i)) for i, (w, h) in enumerate(sizes)], gen_config=GEN)
    assert [o.generate_token_len for o in outputs] == [6, 6, 6]

    spans = spans_by_name(exporter)
    (pipeline_span,) = spans[sc.SPAN_PIPELINE_INFER]
    assert pipeline_span.attributes[sc.PIPELINE_PROMPTS] == 3
    assert pipeline_span.attributes[sc.PIPELINE_IMAGES] == 3

    requests = spans["chat tiny-qwen2vl"]
    assert len(requests) == 3
    assert {parent_of(r, exporter).name for r in requests} == {sc.SPAN_PIPELINE_INFER}
    assert len({r.context.trace_id for r in requests} | {pipeline_span.context.trace_id}) == 1
    session_ids = {r.attributes[sc.LMDEPLOY_SESSION_ID] for r in requests}
    assert len(session_ids) == 3

    for request in requests:
        a = request.attributes
        assert a[sc.STAGE] == sc.STAGE_REQUEST
        assert a[sc.GEN_AI_OPERATION_NAME] == "chat"
        assert a[sc.GEN_AI_PROVIDER_NAME] == "lmdeploy"
        assert a[sc.GEN_AI_REQUEST_MODEL] == "tiny-qwen2vl"
        assert a[sc.GEN_AI_REQUEST_MAX_TOKENS] == 6
        assert a[sc.GEN_AI_REQUEST_TOP_K] == 1
        assert sc.GEN_AI_REQUEST_TEMPERATURE not in a or a[sc.GEN_AI_REQUEST_TEMPERATURE] == GEN.temperature
        assert a[sc.GEN_AI_REQUEST_STREAM] is False
        assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
        assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] > 16
        assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("length",)
        assert 0 < a[sc.REQUEST_TTFT] < (request.end_time - request.start_time) / 1e9
        assert 0 < a[sc.REQUEST_PREPROCESS_DURATION] < a[sc.REQUEST_TTFT]
        assert a[sc.REQUEST_IMAGES] == 1
        assert a[sc.LMDEPLOY_BACKEND] == "turbomind"
        assert sc.GEN_AI_INPUT_MESSAGES not in a and sc.GEN_AI_OUTPUT_MESSAGES not in a
        assert a[sc.GEN_AI_RESPONSE_MODEL] == "tiny-qwen2vl"
        # The reading where prompt processing ended (read then, or earlier and reused: on a CPU it is the
        # sampler's latest, since torch's allocator holds nothing to read live).
        prompt_end = a[sc.PROMPT_END_KEYS[sc.MEM_READ_TIME]]
        assert prompt_end <= request.start_time + a[sc.REQUEST_PREPROCESS_DURATION] * 1e9 + 1e6
        assert a[sc.PROMPT_END_KEYS[sc.MEM_HOST_RSS]] > 0
        # No reading at the last output: TurboMind's stream span ends with the request, and a bracket
        # holding both ends could not tell them apart (the PyTorch engine's requests have one).
        assert not any(key.startswith(sc.RESPONSE_END_PREFIX) for key in a)

    pixels_by_session = {r.attributes[sc.LMDEPLOY_SESSION_ID]: r.attributes[sc.REQUEST_IMAGE_PIXELS] for r in requests}
    assert sorted(pixels_by_session.values()) == sorted(w * h for w, h in sizes)

    for name, parent_name in (
        (sc.SPAN_VISION_PREPROCESS, "chat tiny-qwen2vl"),
        (sc.SPAN_TURBOMIND_STREAM, "chat tiny-qwen2vl"),
    ):
        assert len(spans[name]) == 3, name
        assert {parent_of(s, exporter).name for s in spans[name]} == {parent_name}, name

    vision = sorted(spans[sc.SPAN_VISION_PREPROCESS], key=lambda s: s.attributes[sc.VISION_PIXELS])
    assert [
        (s.attributes[sc.VISION_IMAGE_WIDTHS][0], s.attributes[sc.VISION_IMAGE_HEIGHTS][0]) for s in vision
    ] == sorted(sizes, key=lambda wh: wh[0] * wh[1])
    assert all(s.attributes[sc.VISION_MAX_BATCH_SIZE] == 2 for s in vision)
    assert [s.attributes[sc.VISION_TOKENS] for s in vision] == sorted(s.attributes[sc.VISION_TOKENS] for s in vision)
    assert vision[0].attributes[sc.VISION_TOKENS] >= 4

    streams = spans[sc.SPAN_TURBOMIND_STREAM]
    for stream in streams:
        a = stream.attributes
        assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
        assert a[sc.ENGINE_OUTPUT_CHUNKS] >= 1
        assert a[sc.LMDEPLOY_TM_SCHEDULER_TICK] > 0
        assert 0.0 <= a[sc.LMDEPLOY_TM_CACHE_USAGE] <= 1.0
    stream_sessions = {s.attributes[sc.LMDEPLOY_SESSION_ID] for s in streams}
    assert stream_sessions == session_ids


def test_every_span_has_a_stage_and_host_memory_with_delta(traced, exporter, cpu_pipeline):
    cpu_pipeline(("what is this", image(200, 150)), gen_config=GEN)
    spans = finished(exporter)
    assert len(spans) == 4  # pipeline, request, vision.preprocess, engine stream
    for span in spans:
        assert span.attributes[sc.STAGE]
        assert span.attributes[sc.MEM_HOST_RSS] > 10 * 1024 * 1024
        assert sc.MEM_HOST_RSS + sc.DELTA_SUFFIX in span.attributes
        # no GPU here: device readings are absent, not zero
        assert sc.MEM_GPU_PROCESS not in span.attributes
        assert sc.MEM_TORCH_ALLOCATED not in span.attributes


def test_stream_infer_span_lasts_until_the_stream_is_read(traced, exporter, cpu_pipeline):
    chunks = list(cpu_pipeline.stream_infer([("stream this", image(90, 90))], gen_config=GEN))
    assert sum(len(c.token_ids) for c in chunks) == 6
    spans = spans_by_name(exporter)
    (outer,) = spans[sc.SPAN_PIPELINE_STREAM_INFER]
    (request,) = spans["chat tiny-qwen2vl"]
    assert parent_of(request, exporter) is outer
    assert outer.end_time >= request.end_time


def test_chat_is_one_pipeline_span(traced, exporter, cpu_pipeline):
    session = cpu_pipeline.chat(("hello", image(80, 60)), gen_config=GEN)
    assert session.response.generate_token_len == 6
    spans = spans_by_name(exporter)
    assert len(spans[sc.SPAN_PIPELINE_CHAT]) == 1
    assert sc.SPAN_PIPELINE_STREAM_INFER not in spans
    (request,) = spans["chat tiny-qwen2vl"]
    assert parent_of(request, exporter).name == sc.SPAN_PIPELINE_CHAT


def test_text_only_prompt_has_no_vision_spans(traced, exporter, cpu_pipeline):
    cpu_pipeline("just text", gen_config=GEN)
    spans = spans_by_name(exporter)
    assert sc.SPAN_VISION_PREPROCESS not in spans
    (request,) = spans["chat tiny-qwen2vl"]
    assert sc.REQUEST_IMAGES not in request.attributes
    assert spans[sc.SPAN_PIPELINE_INFER][0].attributes[sc.PIPELINE_IMAGES] == 0


def test_the_request_carries_the_callers_sampling_parameters_seed_stop_sequences_and_streaming(
    traced, exporter, cpu_pipeline
):
    asked = GenerationConfig(
        max_new_tokens=3, top_k=5, top_p=0.9, temperature=0.7, random_seed=1234, stop_words=["</answer>", "STOP"]
    )
    for _ in cpu_pipeline.stream_infer([("describe this image", image(64, 48))], gen_config=asked):
        pass

    (request,) = spans_by_name(exporter)["chat tiny-qwen2vl"]
    a = request.attributes
    assert (
        a[sc.GEN_AI_REQUEST_MAX_TOKENS],
        a[sc.GEN_AI_REQUEST_TOP_K],
        a[sc.GEN_AI_REQUEST_TOP_P],
        a[sc.GEN_AI_REQUEST_TEMPERATURE],
    ) == (3, 5, 0.9, 0.7)
    assert a[sc.GEN_AI_REQUEST_SEED] == 1234
    assert tuple(a[sc.GEN_AI_REQUEST_STOP_SEQUENCES]) == ("</answer>", "STOP")
    assert a[sc.GEN_AI_REQUEST_STREAM] is True


def test_a_stream_closed_after_its_first_output_ends_the_request_with_what_reached_the_caller(
    traced, exporter, cpu_pipeline
):
    engine = cpu_pipeline.async_engine

    async def first_output_then_close():
        request = await engine.preprocess([{"role": "user", "content": "describe this"}], engine.session_mgr.get(), GEN)
        outputs = engine.generate(request, stream_response=True)
        output = await anext(outputs)
        await outputs.aclose()
        return output

    first = asyncio.run_coroutine_threadsafe(first_output_then_close(), cpu_pipeline.internal_thread.loop).result(60)
    assert 0 < first.generate_token_len < GEN.max_new_tokens

    spans = spans_by_name(exporter)
    (request,) = spans["chat tiny-qwen2vl"]
    (stream,) = spans[sc.SPAN_TURBOMIND_STREAM]
    assert parent_of(stream, exporter) is request
    a = request.attributes
    assert a[sc.REQUEST_OUTPUT_CHUNKS] == 1
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == first.generate_token_len
    assert sc.GEN_AI_RESPONSE_FINISH_REASONS not in a
    assert 0 < a[sc.REQUEST_TTFT] < (request.end_time - request.start_time) / 1e9
    assert stream.attributes[sc.ENGINE_OUTPUT_CHUNKS] == 1
    assert request.status.is_ok and stream.status.is_ok  # a consumer closing early is no error
