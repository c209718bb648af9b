"""A recording for test_heap_counter_stage.py, in a process of its own (the heap counter is preloaded at a
process's start or not at all): LMDeploy 0.18's real pipeline on the stand-in TurboMind, one prompt in flight.

`prompt`: each request's prompt processing keeps a 1 MiB buffer that malloc hands out without touching its
pages, and the vision encoder's preprocessing of the same request first writes them. The memory is kept by
prompt processing; its pages become resident in vision preprocessing.

`hand-off`: each request's vision preprocessing allocates a 2 MiB buffer that its engine stream frees (as
TurboMind's stream frees the vision stage's inputs), and the engine stream keeps 1 MiB of its own;
`hand-off-late`: the same, the 1 MiB kept when the stream resumes after its first output.

    python heap_child.py JOURNAL [prompt|hand-off] [PROMPTS_IN_FLIGHT]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MiB = 1 << 20
REQUESTS = 120


def main(journal: str, mode: str, in_flight: int) -> None:
    import numpy as np
    from tests.support.cpu_lmdeploy import cpu_lmdeploy, install_native_standin, tiny_vlm_path

    install_native_standin()  # before TurboMind's module is imported: it binds the native module's classes
    from lmdeploy import GenerationConfig, TurbomindEngineConfig, VisionConfig, pipeline
    from lmdeploy.serve.processors.multimodal import MultimodalProcessor
    from lmdeploy.turbomind.turbomind import TurboMindInstance
    from lmdeploy.vl.engine import ImageEncoder
    from opentelemetry.sdk.trace import TracerProvider

    import vlmtrace
    from tests.support.spans import image

    kept: list = []
    untouched: list = []
    prompt_input, preprocess = MultimodalProcessor._get_multimodal_prompt_input, ImageEncoder.preprocess

    async def keep_in_prompt_processing(processor, *args, **kwargs):
        buffer = np.empty(MiB, np.uint8)  # malloc'd: counted by the heap counter, no page touched yet
        kept.append(buffer)
        untouched.append(buffer)
        return await prompt_input(processor, *args, **kwargs)

    async def touch_in_vision_preprocess(encoder, *args, **kwargs):
        while untouched:
            untouched.pop().fill(1)
        return await preprocess(encoder, *args, **kwargs)

    handed: list = []
    stream = TurboMindInstance.async_stream_infer

    async def hand_to_the_engine(encoder, *args, **kwargs):
        handed.append(np.ones(2 * MiB, np.uint8))
        return await preprocess(encoder, *args, **kwargs)

    async def free_and_keep_in_the_stream(instance, *args, **kwargs):
        handed.clear()
        if mode == "hand-off":
            kept.append(np.ones(MiB, np.uint8))
        outputs = 0
        async for output in stream(instance, *args, **kwargs):
            yield output
            outputs += 1
            if mode == "hand-off-late" and outputs == 1:  # resumed after other requests' tasks ran
                kept.append(np.ones(MiB, np.uint8))

    # Installed before instrument(), as the GPU matrix does: vlmtrace's wrappers call these, inside their spans.
    if mode == "prompt":
        MultimodalProcessor._get_multimodal_prompt_input = keep_in_prompt_processing
        ImageEncoder.preprocess = touch_in_vision_preprocess
    else:
        ImageEncoder.preprocess = hand_to_the_engine
        TurboMindInstance.async_stream_infer = free_and_keep_in_the_stream
    vlmtrace.instrument(tracer_provider=TracerProvider(), journal=journal, sample_interval_ms=20)
    with cpu_lmdeploy():
        pipe = pipeline(tiny_vlm_path(), backend_config=TurbomindEngineConfig(session_len=2048, max_batch_size=4),
                        vision_config=VisionConfig(max_batch_size=2), log_level="ERROR")
        gen = GenerationConfig(max_new_tokens=4, top_k=1)
        for call in range(REQUESTS // in_flight):
            pipe([("describe this image", image(64 + 8 * (i % 5), 48, i)) for i in range(in_flight)], gen_config=gen)
        pipe.close()
    vlmtrace.uninstrument()
    # A stream whose consumer stops at its last output is not resumed after it: at most a few such.
    assert len(kept) == REQUESTS or (mode == "hand-off-late" and len(kept) >= 0.9 * REQUESTS), len(kept)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "prompt", int(sys.argv[3]) if len(sys.argv) > 3 else 1)
