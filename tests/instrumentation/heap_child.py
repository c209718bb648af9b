"""A recording for test_heap_counter.py, in a process of its own (the heap counter is preloaded at a
process's start or not at all): LMDeploy 0.18's real pipeline on the stand-in TurboMind, where each
request's prompt processing keeps a 1 MiB buffer that malloc hands out without touching its pages, and the
vision encoder's preprocessing of the same request first writes them. The memory is kept by prompt
processing; its pages become resident in vision preprocessing.

    python heap_child.py JOURNAL
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MiB = 1 << 20
REQUESTS, IN_FLIGHT = 120, 1


def main(journal: str) -> None:
    import numpy as np
    from lmdeploy import GenerationConfig, TurbomindEngineConfig, VisionConfig, pipeline
    from lmdeploy.serve.processors.multimodal import MultimodalProcessor
    from lmdeploy.vl.engine import ImageEncoder
    from opentelemetry.sdk.trace import TracerProvider

    import vlmtrace
    from tests.support.cpu_lmdeploy import cpu_lmdeploy, tiny_vlm_path
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

    # Installed before instrument(), as the GPU matrix does: vlmtrace's wrappers call these, inside their spans.
    MultimodalProcessor._get_multimodal_prompt_input = keep_in_prompt_processing
    ImageEncoder.preprocess = touch_in_vision_preprocess
    vlmtrace.instrument(tracer_provider=TracerProvider(), journal=journal, sample_interval_ms=100)
    with cpu_lmdeploy():
        pipe = pipeline(tiny_vlm_path(), backend_config=TurbomindEngineConfig(session_len=2048, max_batch_size=4),
                        vision_config=VisionConfig(max_batch_size=2), log_level="ERROR")
        gen = GenerationConfig(max_new_tokens=4, top_k=1)
        for call in range(REQUESTS // IN_FLIGHT):
            pipe([("describe this image", image(64 + 8 * (i % 5), 48, i)) for i in range(IN_FLIGHT)], gen_config=gen)
        pipe.close()
    vlmtrace.uninstrument()
    assert len(kept) == REQUESTS, len(kept)


if __name__ == "__main__":
    main(sys.argv[1])
