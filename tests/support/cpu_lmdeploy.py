"""Run LMDeploy 0.18's real Python on a CPU: the native engine and the GPU queries get stand-ins
(0.12–0.15 run on the same stand-ins).

What is replaced, and nothing else:
- `lmdeploy.turbomind._turbomind` (CUDA-only C++) by `tests.support.turbomind_native`, and 0.12–0.15's
  native `_xgrammar` by placeholders;
- `TurboMind.__init__`'s converter and weight upload (CUDA) by building the object around the
  stand-in engine handle and the stand-in's native ViT input packing;
- `is_bf16_supported` (asks the CUDA driver) by "no", `torch.cuda.mem_get_info` by an 80 GiB card, and `torch.cuda.device` (selects a GPU) by a no-op.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import types
from pathlib import Path

from tests.support import turbomind_native

REPO = Path(__file__).resolve().parents[2]
TINY_VLM = REPO / "tests" / "data" / "tiny-qwen2vl"


def tiny_vlm_path() -> str:
    return os.environ.get("VLMTRACE_TINY_VLM", str(TINY_VLM))


def standin_pipeline():
    """LMDeploy's real pipeline over the stand-in TurboMind engine as the tests and benchmarks build it (call
    inside `cpu_lmdeploy()`): the tiny Qwen2-VL, batches of up to 4 sequences, vision batches of up to 2."""
    from lmdeploy import TurbomindEngineConfig, VisionConfig, pipeline

    return pipeline(
        tiny_vlm_path(),
        backend_config=TurbomindEngineConfig(session_len=2048, max_batch_size=4),
        vision_config=VisionConfig(max_batch_size=2),
        log_level="ERROR",
    )


def write_tiny_text_model(directory: Path) -> str:
    """The tiny model's language half as a Qwen2 LLM directory (config and tokenizer, no weights).
    0.14 and 0.15 serve Qwen2-VL on the PyTorch engine only: an LLM keeps them on TurboMind."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        shutil.copy(TINY_VLM / name, directory / name)
    config = json.loads((TINY_VLM / "config.json").read_text())["text_config"]
    config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def install_native_standin() -> None:
    """Make `from . import _turbomind` in lmdeploy.turbomind find the stand-in (0.12–0.15 also import
    a native `_xgrammar`, only for grammar-constrained decoding: its names are placeholders)."""
    sys.modules.setdefault("lmdeploy.turbomind._turbomind", turbomind_native)
    sys.modules.setdefault("_turbomind", turbomind_native)
    xgrammar = types.ModuleType("_xgrammar")
    xgrammar.__getattr__ = turbomind_native.__getattr__
    sys.modules.setdefault("_xgrammar", xgrammar)


def build_standin_turbomind(model_path: str, backend_config, token_seconds: float = 0.001):
    """A real `TurboMind` Python object whose native handle is the stand-in engine."""
    import copy

    from lmdeploy.tokenizer import Tokenizer
    from lmdeploy.turbomind.turbomind import TurboMind

    engine_config = copy.deepcopy(backend_config)
    if engine_config.max_batch_size is None:
        engine_config.max_batch_size = 8
    engine_config.devices = engine_config.devices or [0]
    tm = TurboMind.__new__(TurboMind)
    tm.model_name = None
    tm.chat_template_name = None
    tm.gpu_count = 1
    tm.devices = engine_config.devices
    tm.engine_config = engine_config
    tm._engine_created = True
    tm.model_comm = turbomind_native.ModelComm(token_seconds=token_seconds)
    tm.source_model = turbomind_native.NativeVisionModel()
    tm.is_dummy = False
    tm.tokenizer = Tokenizer(model_path)
    tm._grammar_compiler = None
    tm.session_len = engine_config.session_len
    return tm


@contextlib.contextmanager
def cpu_lmdeploy(token_seconds: float = 0.001):
    """Patch the native and GPU parts for the duration of the block; yields the stand-in engines built."""
    install_native_standin()
    import lmdeploy.vl.engine as vl_engine
    from lmdeploy.serve.core.async_engine import AsyncEngine

    built = []

    def build_turbomind(self, model_path, backend_config=None, trust_remote_code=False, **kwargs):
        tm = build_standin_turbomind(model_path, backend_config, token_seconds)
        built.append(tm)
        return tm

    import torch

    saved_build = AsyncEngine.__dict__["_build_turbomind"]
    saved_bf16 = vl_engine.is_bf16_supported
    saved_mem_get_info = torch.cuda.mem_get_info
    saved_device = torch.cuda.device
    AsyncEngine._build_turbomind = build_turbomind
    vl_engine.is_bf16_supported = lambda device_type="cuda": False
    torch.cuda.mem_get_info = lambda device=None: (80 << 30, 80 << 30)
    torch.cuda.device = lambda device: contextlib.nullcontext()
    try:
        yield built
    finally:
        AsyncEngine._build_turbomind = saved_build
        vl_engine.is_bf16_supported = saved_bf16
        torch.cuda.mem_get_info = saved_mem_get_info
        torch.cuda.device = saved_device
