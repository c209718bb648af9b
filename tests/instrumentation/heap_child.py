"""A recording for test_heap_counter_stage.py, in a process of its own (the heap counter is preloaded at a
process's start or not at all): LMDeploy 0.18's real pipeline on the stand-in TurboMind, one prompt in flight.

`prompt`: each request's prompt processing keeps a 1 MiB buffer that malloc hands out without touching its
pages, and the vision encoder's preprocessing of the same request first writes them. The memory is kept by
prompt processing; its pages become resident in vision preprocessing.

`hand-off`: each request's vision preprocessing (the model's, on the image encoder's executor thread)
allocates a 2 MiB buffer that its engine stream frees (as TurboMind's stream frees the vision stage's
inputs), and the engine stream keeps 1 MiB of its own; `hand-off-late`: the same, the 1 MiB kept after the
stream has waited once (`await`) and the event loop has run other requests' tasks.

`hand-off-loop`: as `hand-off`, the 2 MiB buffer allocated by the encoder's own preprocessing on the event
loop, before the executor's job: then resident pages rise in vision preprocessing too.

`vision-keep`: the model's preprocessing, on the image encoder's executor thread, keeps 1 MiB a request.

    python heap_child.py JOURNAL [prompt|hand-off|hand-off-late|hand-off-loop|vision-keep] [PROMPTS_IN_FLIGHT]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MiB = 1 << 20
REQUESTS = 120


def main(journal: str, mode: str, in_flight: int) -> None:
    import numpy as np

    from tests.support.cpu_lmdeploy import cpu_lmdeploy, install_native_standin, standin_pipeline

    install_native_standin()  # before TurboMind's module is imported: it binds the native module's classes
    from lmdeploy import GenerationConfig
    from lmdeploy.serve.processors.multimodal import MultimodalProcessor
    from lmdeploy.turbomind.turbomind import TurboMindInstance
    from lmdeploy.vl.engine import ImageEncoder
    from lmdeploy.vl.model.qwen2 import Qwen2VLModel
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
    stream, model_preprocess = TurboMindInstance.async_stream_infer, Qwen2VLModel.preprocess

    def hand_to_the_engine(model, *args, **kwargs):  # on the encoder's executor thread
        handed.append(np.ones(2 * MiB, np.uint8))
        return model_preprocess(model, *args, **kwargs)

    async def hand_to_the_engine_from_the_loop(encoder, *args, **kwargs):
        handed.append(np.ones(2 * MiB, np.uint8))
        return await preprocess(encoder, *args, **kwargs)

    def keep_in_vision_preprocess(model, *args, **kwargs):  # on the encoder's executor thread
        kept.append(np.ones(MiB, np.uint8))
        return model_preprocess(model, *args, **kwargs)

    async def free_and_keep_in_the_stream(instance, *args, **kwargs):
        handed.clear()
        if mode == "hand-off-late":
            await asyncio.sleep(0.001)  # other requests' tasks run, and set their stages on this thread
        kept.append(np.ones(MiB, np.uint8))
        async for output in stream(instance, *args, **kwargs):
            yield output

    # Installed before instrument(), as the GPU matrix does: vlmtrace's wrappers call these, inside their spans.
    if mode == "prompt":
        MultimodalProcessor._get_multimodal_prompt_input = keep_in_prompt_processing
        ImageEncoder.preprocess = touch_in_vision_preprocess
    elif mode == "vision-keep":
        Qwen2VLModel.preprocess = keep_in_vision_preprocess
    else:
        if mode == "hand-off-loop":
            ImageEncoder.preprocess = hand_to_the_engine_from_the_loop
        else:
            Qwen2VLModel.preprocess = hand_to_the_engine
        TurboMindInstance.async_stream_infer = free_and_keep_in_the_stream
    vlmtrace.instrument(tracer_provider=TracerProvider(), journal=journal, sample_interval_ms=20)
    with cpu_lmdeploy():
        pipe = standin_pipeline()
        gen = GenerationConfig(max_new_tokens=4, top_k=1)
        for _call in range(REQUESTS // in_flight):
            pipe([("describe this image", image(64 + 8 * (i % 5), 48, i)) for i in range(in_flight)], gen_config=gen)
        pipe.close()
    vlmtrace.uninstrument()
    assert len(kept) == REQUESTS, len(kept)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "prompt", int(sys.argv[3]) if len(sys.argv) > 3 else 1)
