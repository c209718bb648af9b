"""Run the real Python of LMDeploy 0.4–0.6.4 on a CPU: native and GPU parts get stand-ins.

The pipeline is the torch-vision-tower setup: a LLaVA-architecture model served by TurboMind, its vision
model a torch module in the same process. What is replaced, and nothing else:
- the native `_turbomind` module, by `tests.support.turbomind_native_legacy`;
- `TurboMind` construction (weight conversion and upload, CUDA), by building the real `TurboMind`
  object around the stand-in engine handle (`AsyncEngine._build_turbomind`);
- the vision model (the released ones load GPU weights through `llava`, `accelerate` and remote
  code), by `TinyLlavaVision`: a `VisonModel` whose tower is a tiny random torch module on the CPU
  (`lmdeploy.vl.engine.load_vl_model`);
- 0.4's PyTorch-engine kernels import `triton.runtime.jit.get_cuda_stream`, which current triton
  no longer has: a stand-in that names the default stream.
Everything between — `pipeline()`, `VLAsyncEngine`, the chat and vision prompt templates, image
loading, `ImageEncoder` with its batching loop, `TurboMindInstance` — is the release's own code.

The tiny vision model takes as long as a small ViT does on a GPU (`FORWARD_SECONDS`). Faster, it
trips a race of 0.4's own: its encoder thread answers through `asyncio.Queue._loop`, which Python
≥ 3.10 binds only once the requester awaits the queue; a forward that finishes first kills the
encoder thread (`AttributeError` in `Record.nofify`), and every later image request hangs.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tests.support import turbomind_native_legacy
from tests.support.cpu_lmdeploy import TINY_VLM

PATCH = 14
IMAGE_SIDE = 56  # each image becomes (56 / 14)^2 = 16 vision tokens
FORWARD_SECONDS = 0.05
HIDDEN = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def install_native_standins() -> None:
    sys.modules.setdefault("_turbomind", turbomind_native_legacy)
    import triton.runtime.jit

    if not hasattr(triton.runtime.jit, "get_cuda_stream"):
        triton.runtime.jit.get_cuda_stream = lambda device=None: 0


def write_tiny_llava(directory: Path) -> str:
    """A LLaVA-architecture model directory (config and tokenizer, no weights): the name makes
    LMDeploy pick its `llava-v1` chat template, the architecture its LLaVA vision template."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(TINY_VLM / name, directory / name)
    config = {
        "architectures": ["LlavaLlamaForCausalLM"],
        "model_type": "llava",
        "hidden_size": HIDDEN,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "vocab_size": 512,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


class TinyTower(nn.Module):
    """Patch embedding and projection: the shape of a ViT, not its size."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Linear(PATCH * PATCH * 3, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.patch(patches)))


def _patches(image) -> torch.Tensor:
    pixels = np.asarray(image.convert("RGB").resize((IMAGE_SIDE, IMAGE_SIDE)), dtype=np.float32) / 255.0
    grid = IMAGE_SIDE // PATCH
    tiles = pixels.reshape(grid, PATCH, grid, PATCH, 3).transpose(0, 2, 1, 3, 4)
    return torch.from_numpy(np.ascontiguousarray(tiles)).reshape(grid * grid, -1)


def tiny_llava_vision(base: type) -> object:
    """A vision model of the release's own `VisonModel` base class around `TinyTower`."""

    class TinyLlavaVision(base):
        def __init__(self) -> None:
            self.model = types.SimpleNamespace(vision_tower=TinyTower().eval())
            self.forward_batches: list[int] = []

        @torch.no_grad()
        def forward(self, images, params=None):
            self.forward_batches.append(len(images))
            time.sleep(FORWARD_SECONDS)
            return list(self.model.vision_tower(torch.stack([_patches(image) for image in images])).unbind(0))

        def build_model(self) -> None:
            pass

    return TinyLlavaVision()


def build_standin_turbomind(model_path: str, backend_config, token_seconds: float):
    """A real `TurboMind` Python object whose native handle is the stand-in engine."""
    from lmdeploy.tokenizer import Tokenizer
    from lmdeploy.turbomind.turbomind import TurboMind

    tm = TurboMind.__new__(TurboMind)
    tm.tokenizer = Tokenizer(model_path)
    tm.engine_config = backend_config
    tm.config = types.SimpleNamespace(
        session_len=backend_config.session_len, weight_type="fp16", max_position_embeddings=backend_config.session_len
    )
    tm.model_comm = turbomind_native_legacy.ModelComm(token_seconds)
    tm.node_id = 0
    tm.gpu_count = 1
    tm.nccl_params = None
    tm.session_len = backend_config.session_len
    tm.eos_id = tm.tokenizer.eos_token_id
    tm.stop_words = None
    tm.model_name = None
    return tm


@contextlib.contextmanager
def cpu_lmdeploy_legacy(token_seconds: float = 0.001):
    """Patch the native and GPU parts for the duration of the block; yields what was built."""
    install_native_standins()
    import lmdeploy.vl.engine as vl_engine
    from lmdeploy.serve.async_engine import AsyncEngine
    from lmdeploy.vl.model.base import VisonModel

    built = types.SimpleNamespace(engines=[], vision_models=[])

    def build_turbomind(self, model_path, backend_config=None, *args, **kwargs):
        self.engine = build_standin_turbomind(model_path, backend_config, token_seconds)
        self.backend_config = backend_config
        self.hf_tm_cfg = self.engine.config
        built.engines.append(self.engine)

    def load_vl_model(*args, **kwargs):
        vision = tiny_llava_vision(VisonModel)
        built.vision_models.append(vision)
        return vision

    saved_build = AsyncEngine.__dict__["_build_turbomind"]
    saved_load = vl_engine.load_vl_model
    AsyncEngine._build_turbomind = build_turbomind
    vl_engine.load_vl_model = load_vl_model
    try:
        yield built
    finally:
        AsyncEngine._build_turbomind = saved_build
        vl_engine.load_vl_model = saved_load
