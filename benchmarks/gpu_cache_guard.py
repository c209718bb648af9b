"""The cache guard on a GPU (issue 18): no trimming, `trim_cache`, and empty_cache() after every request.

    source benchmarks/gpu/setup.sh
    python3 benchmarks/gpu_cache_guard.py --out $OUT/guard

The seed-1 shape: a vision tower in torch beside TurboMind's pool. LMDeploy 0.18 runs the tiny
Qwen2-VL's ViT inside TurboMind, so a torch tower stands in for the one seed 1 had (MiniCPM-V's SigLIP
in torch): it runs in the image encoder's worker thread, inside `ImageEncoder.preprocess` (so inside
the `lmdeploy.vision.preprocess` span), on 14-px patches of each image with eager attention, so its
temporaries grow with the square of the image's patches (up to ~1 GiB for a 900 px image). Images of
60-900 px drawn in a seeded order make torch's cache keep segments of many sizes.

Three arms in one process, on the same pipeline and the same seeded requests (one image prompt per
pipeline call), each under its own `vlmtrace.instrument()` with a journal of its own:
- `none`: no trimming;
- `guard`: `trim_cache=--trim-cache` (trims from the sampler's thread, at most once per
  `--trim-interval-ms`);
- `empty_cache`: the application calls `torch.cuda.empty_cache()` after every request (seed 1's cure).
Before the arms, each distinct image goes through the pipeline once (the tower's kernels for a shape
are chosen on first use); between arms torch's cache is emptied and its peak counters reset. Per arm: peak (torch's own
max_memory_reserved) and final torch reserved, peak and final NVML memory (device used, and this
process's where NVML shows it; read after each request), median and p90 request latency, throughput,
trims or empty_cache calls and the bytes they released. `OUT/<arm>/result.json`, `OUT/<arm>/journal/`,
and `OUT/summary.json` with every arm and the latency ratios against `none`; `vlmtrace report
OUT/<arm>/journal` shows the trims on the timeline. The arms run in turn (not interleaved): each needs
its own instrument() session. `--deadline` (seconds from the start) shortens the arms still to run
so the whole run ends in time; a cut-short arm says how many requests it ran.

`--standin` runs the plumbing on a CPU (LMDeploy's Python over the test suite's stand-in TurboMind, a
tiny tower on the CPU): no CUDA, so nothing is cached or trimmed and the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import torch
from gpu_overhead import workload_engine
from PIL import Image
from workload import ImageSet, build_pipeline, generation_config

import vlmtrace

MiB = 1 << 20
ARMS = ("none", "guard", "empty_cache")
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
            for _ in range(layers))
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
            named = {(h if isinstance(h, str) else h.decode()): handle
                     for handle in handles for h in [pynvml.nvmlDeviceGetUUID(handle)]}
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
        mine = next((p.usedGpuMemory for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
                     if p.pid == os.getpid()), None)
        return used, int(mine) if mine is not None else None

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def _peak_final(values: list) -> dict:
    known = [v for v in values if v is not None]
    return {"peak": max(known) if known else None, "final": known[-1] if known else None}


def seeded_images(args: argparse.Namespace) -> ImageSet:
    """The same images, drawn in the same order, for every arm."""
    return ImageSet(args.image_sizes, seed=args.seed, draw_seed=args.seed + 1, max_side=args.max_side)


def run_arm(arm: str, pipe, tower: TorchVisionTower, args: argparse.Namespace, memory: DeviceMemory,
            seconds: float) -> dict:
    journal = os.path.join(args.out, arm, "journal")
    options = {"trim_cache": args.trim_cache, "trim_cache_interval_ms": args.trim_interval_ms} if arm == "guard" else {}
    memory.reset()
    session = vlmtrace.instrument(journal=journal, service_name=f"cache-guard-{arm}", **options)
    images = seeded_images(args)
    gen = generation_config()
    latencies, reserved, used, mine = [], [], [], []
    releases: list[int] = []
    release_seconds: list[float] = []
    encoded = tower.images
    started = time.perf_counter()
    for index in range(args.warmup + args.requests):
        if time.perf_counter() - started > seconds:
            break
        prompts = images.prompts(1)
        begin = time.perf_counter()
        pipe(prompts, gen_config=gen)
        elapsed = time.perf_counter() - begin
        if arm == "empty_cache":
            before, begin = memory.reserved(), time.perf_counter()
            torch.cuda.empty_cache()
            release_seconds.append(time.perf_counter() - begin)
            releases.append(before - memory.reserved())
        if index < args.warmup:
            continue
        latencies.append(elapsed)
        reserved.append(memory.reserved())
        device_used, process_used = memory.nvml()
        used.append(device_used)
        mine.append(process_used)
    wall = time.perf_counter() - started
    time.sleep(0.3)  # samples after the last request
    guard = session.cache_guard
    vlmtrace.uninstrument()
    result = {
        "arm": arm,
        "options": {key: str(value) for key, value in options.items()},
        "requests": len(latencies),
        "cut_short": len(latencies) < args.requests,
        "median_ms": statistics.median(latencies) * 1000 if latencies else None,
        "p90_ms": _percentile(latencies, 0.9) * 1000 if latencies else None,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else None,
        "requests_per_s": (args.warmup + len(latencies)) / wall,
        "tower_images": tower.images - encoded,
        "torch_reserved_bytes": {"peak": torch.cuda.max_memory_reserved() if memory.cuda else None,
                                 "final": reserved[-1] if reserved else None,
                                 "mean": statistics.fmean(reserved) if reserved else None},
        "nvml_device_used_bytes": _peak_final(used),
        "nvml_process_bytes": _peak_final(mine),
        "trims": guard.trims if guard is not None else 0,
        "trim_released_bytes": guard.released_bytes if guard is not None else 0,
        "empty_cache_calls": len(releases),
        "empty_cache_released_bytes": sum(releases),
        "empty_cache_median_ms": statistics.median(release_seconds) * 1000 if release_seconds else None,
        "journal": journal,
        "probes": session.probe.status,
    }
    result["analysis"] = analysed(journal)
    with open(os.path.join(args.out, arm, "result.json"), "w") as handle:
        json.dump(result, handle, indent=2)
    return result


def analysed(journal: str) -> dict | str:
    """What `vlmtrace report` reads from the journal: the trims' and empty_cache calls' cost on the
    requests after them (where the analysis libraries are installed)."""
    try:
        from vlmtrace.analysis.analyze import analyze
        from vlmtrace.analysis.readers.detect import read_inputs

        summary = analyze(read_inputs([journal])).summary
    except Exception as error:  # noqa: BLE001 - the arm's measurements are kept whatever the analysis does
        return f"not analysed here ({type(error).__name__}: {error}): run vlmtrace report on the journal"
    return {"cache_trims": summary.cache_trims, "empty_cache": summary.empty_cache, "leak_found": summary.leak_found,
            "verdicts": {v.component: v.klass for v in summary.verdicts}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory: OUT/<arm>/{result.json,journal/}, OUT/summary.json")
    parser.add_argument("--requests", type=int, default=1000, help="timed requests per arm (one image prompt each)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests at the start of each arm")
    parser.add_argument("--trim-cache", default="512MiB", help="the guard arm's trim_cache (a size, or headroom=SIZE)")
    parser.add_argument("--trim-interval-ms", type=int, default=2000, help="the guard arm's trim_cache_interval_ms")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"which arms, in order (of {', '.join(ARMS)})")
    parser.add_argument("--deadline", type=float, default=210, help="seconds from the start by which every arm has ended")
    parser.add_argument("--image-sizes", type=int, default=24, help="distinct seeded images (60 px to --max-side)")
    parser.add_argument("--max-side", type=int, default=900)
    parser.add_argument("--tower", default="1152,16,4", help="the torch tower's width,heads,layers")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--model", metavar="DIR", help="model directory (default: $VLMTRACE_TINY_VLM)")
    parser.add_argument("--standin", action="store_true", help="CPU: stand-in TurboMind engine, tiny tower (plumbing only)")
    args = parser.parse_args(argv)
    unknown = [arm for arm in args.arms.split(",") if arm not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    began = time.perf_counter()
    arms = args.arms.split(",")
    for arm in arms:
        os.makedirs(os.path.join(args.out, arm), exist_ok=True)
    dim, heads, layers = (int(part) for part in args.tower.split(","))
    device = "cpu" if args.standin else "cuda"
    if args.standin:
        dim, heads, layers = 32, 2, 1
    with workload_engine(args):
        tower = TorchVisionTower(dim, heads, layers, device)
        install_tower(tower)
        pipe = build_pipeline("turbomind")
        memory = DeviceMemory()
        # Every image once before any arm: the tower's kernels for each shape are chosen on first use,
        # which would otherwise fall on whichever arm meets the shape first.
        for image in seeded_images(args).images:
            pipe([("describe this image", image)], gen_config=generation_config())
        results = []
        for position, arm in enumerate(arms):
            left = args.deadline - (time.perf_counter() - began) - 5
            seconds = left / (len(arms) - position)  # an arm that ends early leaves its time to the next
            result = run_arm(arm, pipe, tower, args, memory, seconds)
            print(json.dumps({key: result[key] for key in ("arm", "requests", "median_ms", "p90_ms", "trims",
                                                           "empty_cache_calls", "torch_reserved_bytes")}), flush=True)
            results.append(result)
        pipe.close()
    baseline = next((r for r in results if r["arm"] == "none" and r["median_ms"]), None)
    summary = {
        "arms": results,
        "median_ratio_to_none": {r["arm"]: r["median_ms"] / baseline["median_ms"] for r in results
                                 if baseline is not None and r["median_ms"]},
        "p90_ratio_to_none": {r["arm"]: r["p90_ms"] / baseline["p90_ms"] for r in results
                              if baseline is not None and r["p90_ms"]},
        "seconds": time.perf_counter() - began,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    print(json.dumps({"median_ratio_to_none": summary["median_ratio_to_none"], "seconds": round(summary["seconds"], 1)}))


if __name__ == "__main__":
    main()
