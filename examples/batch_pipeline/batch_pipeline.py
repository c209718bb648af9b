"""Batches of image prompts through `lmdeploy.pipeline`, round after round, traced.

    python batch_pipeline.py --model Qwen/Qwen2-VL-2B-Instruct --prompts 40 --rounds 20 --vision-batch 1

The report this reproduces ran 40 image prompts per call with the vision encoder's `max_batch_size`
at 1 and died in TurboMind with an illegal memory access (`std::terminate`): the crash-safe journal
keeps what was in flight. Images come from `--images DIR` or are generated (sizes vary, so the vision
tokens do too).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import vlmtrace

SIZES = ((448, 448), (640, 480), (480, 640), (1024, 768), (320, 240))


def images(folder: str | None, count: int) -> list:
    import numpy as np
    from PIL import Image

    if folder:
        files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"))
        if not files:
            raise SystemExit(f"no images in {folder}")
        return [Image.open(files[i % len(files)]).convert("RGB") for i in range(count)]
    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        for w, h in (SIZES[i % len(SIZES)] for i in range(count))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen2-VL-2B-Instruct")
    parser.add_argument("--backend", choices=("turbomind", "pytorch"), default="turbomind")
    parser.add_argument("--prompts", type=int, default=40, help="image prompts per pipeline call")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--vision-batch", type=int, default=1, help="VisionConfig.max_batch_size")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--images", help="a folder of images (default: generated ones)")
    parser.add_argument("--journal", default="vlmtrace-journal", help="journal directory (VLMTRACE_JOURNAL)")
    args = parser.parse_args(argv)

    vlmtrace.instrument(journal=args.journal)
    from lmdeploy import GenerationConfig, PytorchEngineConfig, TurbomindEngineConfig, VisionConfig, pipeline

    engine = (TurbomindEngineConfig if args.backend == "turbomind" else PytorchEngineConfig)(session_len=8192)
    pipe = pipeline(args.model, backend_config=engine, vision_config=VisionConfig(max_batch_size=args.vision_batch))
    prompts = [("describe this image", image) for image in images(args.images, args.prompts)]
    gen_config = GenerationConfig(max_new_tokens=args.max_new_tokens, top_k=1)
    try:
        for round_index in range(args.rounds):
            began = time.perf_counter()
            outputs = pipe(prompts, gen_config=gen_config)
            print(
                f"round {round_index}: {len(outputs)} answers, {sum(o.generate_token_len for o in outputs)} tokens, "
                f"{time.perf_counter() - began:.2f} s",
                flush=True,
            )
    finally:
        pipe.close()
        vlmtrace.uninstrument()
    print(f"journal in {args.journal}; next: vlmtrace report {args.journal} -o report.html")
    return 0


if __name__ == "__main__":  # the PyTorch engine starts processes of its own: keep the entry point guarded
    sys.exit(main())
