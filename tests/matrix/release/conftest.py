"""Inside one release's process: the stand-ins for its native parts, and its real pipeline on a CPU.

The pipeline each release serves:
- 0.4–0.6.4: a LLaVA-architecture VLM on TurboMind with a torch vision model in the process (the
  torch-vision-tower setup; `tests/support/cpu_lmdeploy_legacy.py`);
- 0.12–0.15: an LLM on TurboMind (0.14 and 0.15 serve Qwen2-VL only on the PyTorch engine, which
  needs a GPU); the vision encoder is checked on its own (`check_vision.py`);
- 0.16+: the tiny Qwen2-VL on TurboMind (`tests/support/cpu_lmdeploy.py`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from tests.matrix.release.this_release import FAMILY, LEGACY, VISION_MAX_BATCH, vision_config
from tests.support import cpu_lmdeploy, cpu_lmdeploy_legacy
from tests.support.spans import exporter, traced  # noqa: F401 - fixtures

if LEGACY:
    cpu_lmdeploy_legacy.install_native_standins()
else:
    cpu_lmdeploy.install_native_standin()


@dataclasses.dataclass
class Served:
    """A release's pipeline and what its spans should say about it."""

    pipe: Any  # what `lmdeploy.pipeline()` returned
    model: str  # the model name the engine reports
    images: bool  # whether its prompts may carry images
    vision_span: str  # the per-request vision span under `lmdeploy.preprocess`


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    from lmdeploy import TurbomindEngineConfig, pipeline

    from vlmtrace import semconv as sc

    engine_config = TurbomindEngineConfig(session_len=2048, max_batch_size=4)
    if LEGACY:
        with cpu_lmdeploy_legacy.cpu_lmdeploy_legacy():
            model = cpu_lmdeploy_legacy.write_tiny_llava(tmp_path_factory.mktemp("model") / "tiny-llava-v1.5")
            pipe = pipeline(
                model, backend_config=engine_config, vision_config=vision_config(VISION_MAX_BATCH), log_level="ERROR"
            )
            yield Served(pipe, os.path.basename(pipe.model_name), True, sc.SPAN_VISION_INFER)
        return
    with cpu_lmdeploy.cpu_lmdeploy():
        if FAMILY == "0.12–0.15":
            model = cpu_lmdeploy.write_tiny_text_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")
            pipe = pipeline(model, backend_config=engine_config, log_level="ERROR")
            served_images = False
        else:
            pipe = pipeline(
                cpu_lmdeploy.tiny_vlm_path(),
                backend_config=engine_config,
                vision_config=vision_config(VISION_MAX_BATCH),
                log_level="ERROR",
            )
            served_images = True
        yield Served(pipe, os.path.basename(pipe.async_engine.model_name), served_images, sc.SPAN_VISION_PREPROCESS)
        pipe.close()
