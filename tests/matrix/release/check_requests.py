"""This release's real pipeline, traced: one parent chain per request, from the pipeline call down to
the engine stream, with what the request asked for and got."""

from __future__ import annotations

from lmdeploy import GenerationConfig

from tests.support.spans import image, parent_of, spans_by_name
from vlmtrace import semconv as sc

GEN = GenerationConfig(max_new_tokens=6, top_k=1)
SIZES = [(120, 100), (300, 200), (64, 64)]


def _prompts(served, texts):
    if not served.images:
        return list(texts)
    return [(text, image(w, h, i)) for i, (text, (w, h)) in enumerate(zip(texts, SIZES))]


def test_a_batch_gives_one_parent_chain_per_request(traced, exporter, served):
    outputs = served.pipe(_prompts(served, ["describe this image", "and this one", "and that"]), gen_config=GEN)
    assert [o.generate_token_len for o in outputs] == [6, 6, 6]

    spans = spans_by_name(exporter)
    (pipeline_span,) = spans[sc.SPAN_PIPELINE_INFER]
    assert pipeline_span.attributes[sc.PIPELINE_PROMPTS] == 3
    assert pipeline_span.attributes[sc.PIPELINE_IMAGES] == (3 if served.images else 0)

    requests = spans[f"chat {served.model}"]
    assert len(requests) == 3
    assert {parent_of(r, exporter).name for r in requests} == {sc.SPAN_PIPELINE_INFER}
    assert {r.context.trace_id for r in requests} == {pipeline_span.context.trace_id}
    assert len({r.attributes[sc.LMDEPLOY_SESSION_ID] for r in requests}) == 3
    for request in requests:
        a = request.attributes
        assert a[sc.STAGE] == sc.STAGE_REQUEST
        assert a[sc.GEN_AI_OPERATION_NAME] == "chat"
        assert a[sc.GEN_AI_PROVIDER_NAME] == "lmdeploy"
        assert a[sc.GEN_AI_REQUEST_MODEL] == served.model
        assert a[sc.LMDEPLOY_BACKEND] == "turbomind"
        assert a[sc.GEN_AI_REQUEST_MAX_TOKENS] == 6
        assert a[sc.GEN_AI_REQUEST_TOP_K] == 1
        assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
        assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("length",)
        assert 0 < a[sc.REQUEST_TTFT] < (request.end_time - request.start_time) / 1e9
        assert 0 < a[sc.REQUEST_PREPROCESS_DURATION] < a[sc.REQUEST_TTFT]
        assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] > 4

    assert len(spans[sc.SPAN_TURBOMIND_STREAM]) == 3
    for stream in spans[sc.SPAN_TURBOMIND_STREAM]:
        assert stream.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
        assert (
            stream.attributes[sc.LMDEPLOY_SESSION_ID] == parent_of(stream, exporter).attributes[sc.LMDEPLOY_SESSION_ID]
        )

    if served.images:
        assert all(r.attributes[sc.REQUEST_IMAGES] == 1 for r in requests)
        assert sorted(r.attributes[sc.REQUEST_IMAGE_PIXELS] for r in requests) == sorted(w * h for w, h in SIZES)
        vision = spans[served.vision_span]
        assert len(vision) == 3
        assert {parent_of(s, exporter).name for s in vision} == {f"chat {served.model}"}
        assert sorted(
            (s.attributes[sc.VISION_IMAGE_WIDTHS][0], s.attributes[sc.VISION_IMAGE_HEIGHTS][0]) for s in vision
        ) == sorted(SIZES)


def test_a_stream_span_lasts_until_the_stream_is_read(traced, exporter, served):
    chunks = list(served.pipe.stream_infer(_prompts(served, ["stream this"]), gen_config=GEN))
    assert sum(len(c.token_ids or ()) for c in chunks) == 6  # 0.4–0.6.4 end with a chunk of none
    spans = spans_by_name(exporter)
    (outer,) = spans[sc.SPAN_PIPELINE_STREAM_INFER]
    (request,) = spans[f"chat {served.model}"]
    assert parent_of(request, exporter) is outer
    assert outer.end_time >= request.end_time


def test_chat_is_one_pipeline_span_over_its_request(traced, exporter, served):
    session = served.pipe.chat(_prompts(served, ["hello"])[0], gen_config=GEN)
    assert session.response.generate_token_len == 6
    spans = spans_by_name(exporter)
    (chat,) = spans[sc.SPAN_PIPELINE_CHAT]
    assert sc.SPAN_PIPELINE_INFER not in spans and sc.SPAN_PIPELINE_STREAM_INFER not in spans
    (request,) = spans[f"chat {served.model}"]
    assert parent_of(request, exporter) is chat
