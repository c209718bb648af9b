"""This release's vision encoder, traced: image sizes from the release's own image handling, and
(0.4–0.6.4) the encoder's own batches as traces of their own, linked to the requests they served,
with the torch ViT's forward inside them."""

from __future__ import annotations

import asyncio

import pytest
from lmdeploy import GenerationConfig

from tests.matrix.release.this_release import LEGACY, RELEASE, VISION_MAX_BATCH, vision_config
from tests.support import cpu_lmdeploy
from tests.support.cpu_lmdeploy_legacy import IMAGE_SIDE, PATCH
from tests.support.spans import image, parent_of, spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation.targets import parse_version

SIZES = [(120, 100), (300, 200), (64, 64)]


@pytest.mark.skipif(not LEGACY, reason="the encoder batches images itself only up to 0.6.4")
def test_each_encoder_batch_is_a_trace_linked_to_the_requests_it_served(traced, exporter, served):
    served.pipe(
        [(f"describe image {i}", image(w, h, i)) for i, (w, h) in enumerate(SIZES)],
        gen_config=GenerationConfig(max_new_tokens=2),
    )
    spans = spans_by_name(exporter)
    requests = {s.context.span_id: s for s in spans[sc.SPAN_VISION_INFER]}
    assert len(requests) == 3
    for request in requests.values():
        assert request.attributes[sc.VISION_IMAGES] == 1
        assert request.attributes[sc.VISION_MAX_BATCH_SIZE] == VISION_MAX_BATCH

    batches = spans[sc.SPAN_VISION_BATCH]
    served_requests = []
    for batch in batches:
        assert batch.parent is None
        assert 1 <= batch.attributes[sc.VISION_IMAGES] <= VISION_MAX_BATCH
        linked = [requests[link.context.span_id] for link in batch.links]
        assert len(linked) == batch.attributes[sc.VISION_IMAGES]
        assert list(batch.attributes[sc.VISION_IMAGE_WIDTHS]) == [
            r.attributes[sc.VISION_IMAGE_WIDTHS][0] for r in linked
        ]
        assert batch.attributes[sc.VISION_PIXELS] == sum(r.attributes[sc.VISION_PIXELS] for r in linked)
        served_requests.extend(r.context.span_id for r in linked)
    assert sorted(served_requests) == sorted(requests)

    forwards = spans[sc.SPAN_VISION_FORWARD]
    assert sorted(parent_of(f, exporter).context.span_id for f in forwards) == sorted(
        b.context.span_id for b in batches
    )
    for forward in forwards:
        batch = parent_of(forward, exporter)
        tokens = (IMAGE_SIDE // PATCH) ** 2
        assert list(forward.attributes[sc.VISION_INPUT_SHAPE]) == [
            batch.attributes[sc.VISION_IMAGES],
            tokens,
            PATCH * PATCH * 3,
        ]
        assert forward.attributes[sc.VISION_MODULE] == "TinyTower"


@pytest.mark.skipif(
    not LEGACY or parse_version(RELEASE) < (0, 6), reason="Qwen2-VL came in 0.6; 0.6.5 on batch differently"
)
def test_the_release_s_own_qwen2_vl_vision_model_runs_hooked_inside_its_batch(traced, exporter, tmp_path, monkeypatch):
    """The ViT hook on a real vision tower (transformers 4.48's Qwen2-VL, random weights on the CPU)."""
    import lmdeploy.vl.engine as vl_engine
    from lmdeploy.vl.engine import ImageEncoder
    from lmdeploy.vl.model.builder import load_vl_model

    from tests.support.qwen2_vl_legacy import weights_on_cpu, write_tiny_qwen2_vl

    monkeypatch.setattr(vl_engine, "load_vl_model", load_vl_model)  # the release's own, not the pipeline's stand-in
    with weights_on_cpu():
        encoder = ImageEncoder(write_tiny_qwen2_vl(tmp_path / "tiny-qwen2vl"), vision_config(VISION_MAX_BATCH))
    features = asyncio.run(encoder.async_infer([image(120, 100), image(300, 200, 1)]))
    assert [feature["grid_thw"] for feature in features] == [[1, 8, 8], [1, 12, 20]]

    spans = spans_by_name(exporter)
    (request,) = spans[sc.SPAN_VISION_INFER]
    assert list(request.attributes[sc.VISION_IMAGE_WIDTHS]) == [120, 300]
    (batch,) = spans[sc.SPAN_VISION_BATCH]
    assert [link.context.span_id for link in batch.links] == [request.context.span_id]
    assert batch.attributes[sc.VISION_IMAGES] == 2
    (forward,) = spans[sc.SPAN_VISION_FORWARD]
    assert parent_of(forward, exporter) is batch
    assert forward.attributes[sc.VISION_MODULE] == "Qwen2VisionTransformerPretrainedModel"
    assert list(forward.attributes[sc.VISION_INPUT_SHAPE]) == [8 * 8 + 12 * 20, 3 * 2 * 14 * 14]  # patches × (C·T·P·P)


@pytest.mark.skipif(LEGACY, reason="0.4–0.6.4 have no ImageEncoder.preprocess")
def test_the_encoder_preprocesses_real_images_in_its_span(traced, exporter):
    """The tiny Qwen2-VL's real image processor, through `ImageEncoder` as the PyTorch engine builds it
    (which loads no weights)."""
    from lmdeploy.vl.engine import ImageEncoder

    with cpu_lmdeploy.cpu_lmdeploy():
        encoder = ImageEncoder(cpu_lmdeploy.tiny_vlm_path(), "pytorch", vision_config(VISION_MAX_BATCH))
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "compare"}]
            + [{"type": "image", "data": image(w, h, i)} for i, (w, h) in enumerate(SIZES[:2])],
        }
    ]
    asyncio.run(encoder.preprocess(messages))

    (span,) = spans_by_name(exporter)[sc.SPAN_VISION_PREPROCESS]
    a = span.attributes
    assert a[sc.VISION_IMAGES] == 2
    assert list(zip(a[sc.VISION_IMAGE_WIDTHS], a[sc.VISION_IMAGE_HEIGHTS])) == SIZES[:2]
    assert a[sc.VISION_PIXELS] == sum(w * h for w, h in SIZES[:2])
    assert a[sc.VISION_MAX_BATCH_SIZE] == VISION_MAX_BATCH
    assert a[sc.VISION_TOKENS] > 2
