"""LMDeploy 0.6's own Qwen2-VL vision model (`lmdeploy.vl.model.qwen2.Qwen2VLModel`) on a CPU.

Its `build_model` builds transformers' `Qwen2VLForConditionalGeneration` from the config without
weights, then loads and places them with `accelerate.load_checkpoint_and_dispatch` on the GPUs
`torch.cuda.mem_get_info` reports. Those two are the only parts replaced: the weights become random
ones on the CPU (in the dtype the release asked for), and the card has 80 GiB. The processor, the
ViT (transformers 4.48's `Qwen2VisionTransformerPretrainedModel`) and LMDeploy's code around them
are real.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import torch

from tests.support.cpu_lmdeploy import TINY_VLM


def write_tiny_qwen2_vl(directory: Path) -> str:
    """The tiny Qwen2-VL with its config in transformers 4.48's layout (no nested `text_config`)."""
    shutil.copytree(TINY_VLM, directory)
    config = json.loads((directory / "config.json").read_text())
    config.pop("text_config")
    config["rope_scaling"] = {"type": "mrope", "mrope_section": config["rope_scaling"]["mrope_section"]}
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def _random_weights_on_cpu(model, checkpoint=None, **kwargs):
    from accelerate.utils import set_module_tensor_to_device

    generator = torch.Generator().manual_seed(0)
    for name, parameter in list(model.named_parameters()):
        value = torch.randn(parameter.shape, generator=generator) * 0.02
        set_module_tensor_to_device(model, name, "cpu", value=value.to(parameter.dtype))
    return model


@contextlib.contextmanager
def weights_on_cpu():
    import accelerate

    saved_load, saved_mem_get_info = accelerate.load_checkpoint_and_dispatch, torch.cuda.mem_get_info
    accelerate.load_checkpoint_and_dispatch = _random_weights_on_cpu
    torch.cuda.mem_get_info = lambda device=None: (80 << 30, 80 << 30)
    try:
        yield
    finally:
        accelerate.load_checkpoint_and_dispatch, torch.cuda.mem_get_info = saved_load, saved_mem_get_info
