"""A torch vision tower for benchmarks/gpu_cache_guard.py: a vision tower in torch, run inside LMDeploy's
image encoder, and the device memory read around each request.

LMDeploy 0.18 runs the tiny Qwen2-VL's ViT inside TurboMind, so a torch tower stands in for the one
a MiniCPM-V deployment has (MiniCPM-V's SigLIP in torch): it runs in the image encoder's worker thread, inside
`ImageEncoder.preprocess` (so inside the `lmdeploy.vision.preprocess` span), on 14-px patches of each
image with eager attention, so its temporaries grow with the square of the image's patches.
"""

from __future__ import annotations

import asyncio
import json
import os

import torch
from PIL import Image

PATCH = 14


class TorchVisionTower(torch.nn.Module):
    """Transformer layers over an image's 14-px patches, attention computed eagerly (scores and
    softmax materialised per head), as older torch ViTs do."""

    def __init__(self, dim: int, heads: int, layers: int, device: str) -> None:
        super().__init__()
        self.dim, self.heads = dim, heads
        dtype = torch.float16 if device == "cuda" else torch.float32
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
        self.mlp = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
            for _ in range(layers)
        )
        self.to(device=device, dtype=dtype)
        self.device, self.dtype = device, dtype
        self.images = 0  # encoded so far: proves the tower ran once per image

    @torch.inference_mode()
    def encode(self, width: int, height: int) -> float:
        self.images += 1
        tokens = max(1, width // PATCH) * max(1, height // PATCH)
        x = torch.randn(tokens, self.dim, device=self.device, dtype=self.dtype)
        head_dim = self.dim // self.heads
        for qkv, out, mlp in zip(self.qkv, self.out, self.mlp):
            q, k, v = qkv(x).view(tokens, 3, self.heads, head_dim).permute(1, 2, 0, 3)
            attention = ((q @ k.transpose(-1, -2)) * head_dim**-0.5).softmax(-1)
            x = x + out((attention @ v).transpose(0, 1).reshape(tokens, self.dim))
            x = x + mlp(x)
        return float(x.float().mean())  # waits for the GPU: the embeddings feed the language model


def _image_sizes(value) -> list[tuple[int, int]]:
    """The sizes of the PIL images anywhere in LMDeploy's messages (their layout moves between releases)."""
    if isinstance(value, Image.Image):
        return [value.size]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [size for item in items for size in _image_sizes(item)]


def install_tower(tower: TorchVisionTower) -> None:
    """Run the tower on each image of a request in the encoder's worker thread, before LMDeploy's own
    preprocessing; patched before vlmtrace wraps the method, so it runs inside the vision span."""
    from lmdeploy.vl.engine import ImageEncoder

    original = ImageEncoder.__dict__["preprocess"]

    async def preprocess(encoder, messages, *args, **kwargs):
        loop = asyncio.get_running_loop()
        for width, height in _image_sizes(messages):
            await loop.run_in_executor(encoder.executor, tower.encode, width, height)
        return await original(encoder, messages, *args, **kwargs)

    ImageEncoder.preprocess = preprocess


class DeviceMemory:
    """torch's reserved bytes and NVML's view of the device torch uses (None where not readable)."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self._nvml = self._handle = None
        if not self.cuda:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(0).uuid)
            uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            named = {
                (h if isinstance(h, str) else h.decode()): handle
                for handle in handles
                for h in [pynvml.nvmlDeviceGetUUID(handle)]
            }
            self._handle = named[uuid]  # CUDA's device 0 as NVML numbers it (CUDA_VISIBLE_DEVICES may reorder)
            self._nvml = pynvml
        except Exception as error:  # noqa: BLE001 - the run goes on with torch's numbers alone
            print(json.dumps({"nvml": f"unavailable: {error}"}), flush=True)

    def reserved(self) -> int:
        return torch.cuda.memory_reserved() if self.cuda else 0

    def nvml(self) -> tuple[int | None, int | None]:
        """(device used, this process's use) in bytes."""
        if self._nvml is None:
            return None, None
        used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        mine = next(
            (
                p.usedGpuMemory
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
                if p.pid == os.getpid()
            ),
            None,
        )
        return used, int(mine) if mine is not None else None

    def empty(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_reserved(self) -> int | None:
        return torch.cuda.max_memory_reserved() if self.cuda else None
