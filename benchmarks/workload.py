"""The tiny-VLM workload every GPU script shares: a pipeline per backend and seeded image batches.

Runs on the lent H200 (see benchmarks/gpu/README.md); the model directory comes from
VLMTRACE_TINY_VLM, which the device set-up exports.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

BACKENDS = ("turbomind", "pytorch")


@dataclass(frozen=True)
class Batch:
    sizes: tuple[tuple[int, int], ...]  # (width, height) of each prompt's image
    seed: int

    def prompts(self) -> list[tuple[str, Image.Image]]:
        rng = np.random.default_rng(self.seed)
        return [
            ("describe this image", Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)))
            for w, h in self.sizes
        ]

    @property
    def pixels(self) -> int:
        return sum(w * h for w, h in self.sizes)


def batches(count: int, seed: int = 0, max_prompts: int = 4, min_side: int = 60, max_side: int = 600) -> list[Batch]:
    """Mixed batch sizes (1..max_prompts) and image sizes, the same every run for a seed."""
    rng = np.random.default_rng(seed)
    chosen = []
    for index in range(count):
        prompts = int(rng.integers(1, max_prompts + 1))
        sizes = tuple(
            (int(rng.integers(min_side, max_side)), int(rng.integers(min_side, max_side))) for _ in range(prompts)
        )
        chosen.append(Batch(sizes, seed * 100_003 + index))
    return chosen


def build_pipeline(backend: str, vision_batch: int = 1, max_batch_size: int = 8, cache: float = 0.05):
    from lmdeploy import PytorchEngineConfig, TurbomindEngineConfig, VisionConfig, pipeline

    config_class = TurbomindEngineConfig if backend == "turbomind" else PytorchEngineConfig
    config = config_class(max_batch_size=max_batch_size, cache_max_entry_count=cache, session_len=2048)
    return pipeline(
        os.environ["VLMTRACE_TINY_VLM"],
        backend_config=config,
        vision_config=VisionConfig(max_batch_size=vision_batch),
        log_level="ERROR",
    )


def generation_config(max_new_tokens: int = 16):
    from lmdeploy import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, top_k=1)


def timed(pipe, batch: Batch, gen) -> float:
    """Wall seconds of one pipeline call (prompt images are built before the clock starts)."""
    prompts = batch.prompts()
    start = time.perf_counter()
    pipe(prompts, gen_config=gen)
    return time.perf_counter() - start


class ImageSet:
    """A few seeded random images, built once, drawn in a seeded order: thousands of requests without
    minutes of image building, and still a mix of sizes (and so of vision tokens and size buckets)."""

    def __init__(self, sizes: int, seed: int, draw_seed: int, min_side: int = 60, max_side: int = 600) -> None:
        rng = np.random.default_rng(seed)
        self.images = []
        for _ in range(sizes):
            w, h = (int(v) for v in rng.integers(min_side, max_side, 2))
            self.images.append(Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)))
        self._draw = np.random.default_rng(draw_seed)

    def prompts(self, count: int) -> list[tuple[str, Image.Image]]:
        return [("describe this image", self.images[int(i)]) for i in self._draw.integers(0, len(self.images), count)]
