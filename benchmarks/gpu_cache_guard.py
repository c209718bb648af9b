"""The cache guard on a GPU: no trimming, `trim_cache`, and empty_cache() after every request.

    source benchmarks/gpu/setup.sh
    python3 benchmarks/gpu_cache_guard.py --out $OUT/guard

A vision tower in torch beside TurboMind's pool (benchmarks/torch_tower.py: eager
attention on 14-px patches inside the `lmdeploy.vision.preprocess` span, up to ~1.5 GiB of
temporaries for a 900 px image). Images of 60-900 px drawn in a seeded order make torch's cache keep
segments of many sizes.

Arms (`--arms`), all on one pipeline in one process, each with vlmtrace's journal and sampler:
- `none`: no trimming;
- `guard` or `guard=SIZE`: `trim_cache=SIZE` (`--trim-cache` for plain `guard`),
  `trim_cache_interval_ms=--trim-interval-ms` (0: every crossing is trimmed, at the sample or the
  vision-stage end that shows it); `guard=SIZE@MS`: that arm's interval is MS;
- `empty_cache`: the application calls `torch.cuda.empty_cache()` after every request (the usual workaround;
  the call is outside the request's timed span, its cost lands on the requests after it).
The arms alternate in blocks: `--blocks` rounds, each running one block of every arm in an order
rotated every round (`--order random`: shuffled per round with `--seed`). In round b every arm gets
the same seeded requests (one image prompt per pipeline call), different from round to round. Each
block is its own `vlmtrace.instrument()` session (uninstrumented after it, its own journal) and
starts from an empty torch cache with `--warmup` untimed requests; torch's peak counter is reset after
them. Before the first round each distinct image goes through the pipeline once (the tower's kernels
for a shape are chosen on first use). `--deadline` (seconds from the start, the model load included)
starts no round that the slowest round so far says would end after it: rounds run whole, so every
arm has the same requests.

`OUT/summary.json` (rewritten after every round), per arm: median and p90 latency over its timed
requests; each round's median over `none`'s in the same round (median, min, max, every round's); torch's
peak reserved (its own max_memory_reserved, within requests included) and, after each request, torch's
reserved and NVML's process and device memory (peak, mean); trims, bytes released, vision-stage wakes
(over whole blocks, warm-up included); empty_cache calls; `vlmtrace report`'s reading of the arm's last journal. `done_when`: the guard's acceptance test
per guard arm. Every block under `blocks`; the journals in `OUT/journals.tar.gz` (`b<round>-<arm>/`).

`--standin` runs the plumbing on a CPU (LMDeploy's Python over the test suite's stand-in TurboMind, a
tiny tower on the CPU): no CUDA, so nothing is cached or trimmed and the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tarfile
import tempfile
import time

import torch
from gpu_overhead import await_native_counters, workload_engine
from torch_tower import DeviceMemory, TorchVisionTower, install_tower
from workload import ImageSet, build_pipeline, generation_config

import vlmtrace
from vlmtrace.config import CACHED, CacheBound, Options

ARM_KINDS = ("none", "guard", "empty_cache")


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def _peak_mean(values: list) -> dict:
    known = [v for v in values if v is not None]
    return {"peak": max(known) if known else None, "mean": statistics.fmean(known) if known else None}


def arm_options(arm: str, args: argparse.Namespace) -> dict:
    """What `instrument()` gets beyond the journal: the guard's bound and interval for a guard arm."""
    options = {"sample_interval_ms": args.sample_interval_ms}
    if arm.partition("=")[0] == "guard":
        size, _, interval = arm.partition("=")[2].partition("@")
        options.update(
            trim_cache=size or args.trim_cache,
            trim_cache_interval_ms=int(interval) if interval.isdigit() else interval or args.trim_interval_ms,
        )
    return options


def round_order(arms: list[str], index: int, args: argparse.Namespace) -> list[str]:
    if args.order == "random":
        order = list(arms)
        random.Random(args.seed * 1000 + index).shuffle(order)
        return order
    shift = index % len(arms)
    return arms[shift:] + arms[:shift]


def round_plan(images: ImageSet, index: int, count: int, seed: int) -> list[int]:
    """Which images round `index` sends, in order: the same for every arm of the round."""
    draw = random.Random(seed * 100_003 + index)
    return [draw.randrange(len(images.images)) for _ in range(count)]


def run_block(
    arm: str,
    index: int,
    plan: list[int],
    pipe,
    tower: TorchVisionTower,
    images: ImageSet,
    args: argparse.Namespace,
    memory: DeviceMemory,
    journals: str,
) -> dict:
    """One block of one arm: its own instrument() session and journal, `--warmup` untimed requests,
    then the timed ones."""
    journal = os.path.join(journals, f"b{index:02d}-{arm.replace('=', '-').replace('@', '-')}")
    memory.empty()
    session = vlmtrace.instrument(journal=journal, service_name=f"cache-guard-{arm}", **arm_options(arm, args))
    await_native_counters(session)  # built by the first block, loaded by the others
    torch_probe = session.probe.torch_allocator
    gen = generation_config()
    latencies, reserved, used, mine, releases, release_seconds = [], [], [], [], [], []
    encoded = tower.images
    started = time.perf_counter()
    for position, image in enumerate(plan):
        if position == args.warmup:
            memory.reset_peak()
        prompts = [("describe this image", images.images[image])]
        begin = time.perf_counter()
        pipe(prompts, gen_config=gen)
        elapsed = time.perf_counter() - begin
        if arm == "empty_cache":
            before, begin = memory.reserved(), time.perf_counter()
            torch.cuda.empty_cache()
            release_seconds.append(time.perf_counter() - begin)
            releases.append(before - memory.reserved())
        if position < args.warmup:
            continue
        latencies.append(elapsed)
        reserved.append(memory.reserved())
        device_used, process_used = memory.nvml()
        used.append(device_used)
        mine.append(process_used)
    wall = time.perf_counter() - started
    peak = memory.peak_reserved()
    guard = session.cache_guard
    vlmtrace.uninstrument()
    return {
        "arm": arm,
        "block": index,
        "journal": journal,
        "latencies_s": latencies,
        "wall_s": wall,
        "requests_per_s": len(plan) / wall,
        "tower_images": tower.images - encoded,
        "peak_reserved": peak,
        "reserved": reserved,
        "device_used": used,
        "process": mine,
        "trims": guard.trims if guard is not None else 0,
        "trim_released_bytes": guard.released_bytes if guard is not None else 0,
        "stage_end_wakes": guard.wakes if guard is not None else 0,
        "torch_counters": torch_probe.native_state if torch_probe is not None else "no torch",
        "empty_cache_calls": len(releases),
        "empty_cache_released_bytes": sum(releases),
        "empty_cache_seconds": release_seconds,
        "probes": session.probe.status,
    }


def summarise_arm(arm: str, blocks: list[dict], baseline: list[dict] | None, args: argparse.Namespace) -> dict:
    latencies = [value for block in blocks for value in block["latencies_s"]]
    releases = [value for block in blocks for value in block["empty_cache_seconds"]]
    peaks = [block["peak_reserved"] for block in blocks if block["peak_reserved"] is not None]
    result = {
        "arm": arm,
        "options": {key: str(value) for key, value in arm_options(arm, args).items()},
        "blocks": len(blocks),
        "requests": len(latencies),
        "median_ms": statistics.median(latencies) * 1000 if latencies else None,
        "p90_ms": _percentile(latencies, 0.9) * 1000 if latencies else None,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else None,
        "requests_per_s": statistics.fmean(block["requests_per_s"] for block in blocks) if blocks else None,
        "tower_images": sum(block["tower_images"] for block in blocks),
        "torch_reserved_bytes": {
            "peak": max(peaks) if peaks else None,
            "block_peak_median": statistics.median(peaks) if peaks else None,
            "after_request": _peak_mean([v for block in blocks for v in block["reserved"]]),
        },
        "nvml_process_bytes": _peak_mean([v for block in blocks for v in block["process"]]),
        "nvml_device_used_bytes": _peak_mean([v for block in blocks for v in block["device_used"]]),
        "trims": sum(block["trims"] for block in blocks),
        "trim_released_bytes": sum(block["trim_released_bytes"] for block in blocks),
        "stage_end_wakes": sum(block["stage_end_wakes"] for block in blocks),
        "torch_counters": sorted({block["torch_counters"] for block in blocks}),
        "empty_cache_calls": sum(block["empty_cache_calls"] for block in blocks),
        "empty_cache_released_bytes": sum(block["empty_cache_released_bytes"] for block in blocks),
        "empty_cache_median_ms": statistics.median(releases) * 1000 if releases else None,
        "probes": blocks[-1]["probes"] if blocks else None,
    }
    if baseline and latencies:
        ratios = [
            statistics.median(mine["latencies_s"]) / statistics.median(base["latencies_s"])
            for mine, base in zip(blocks, baseline)
        ]
        result["block_median_ratio_to_none"] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "blocks": ratios,
        }
        base = [value for block in baseline for value in block["latencies_s"]]
        result["median_ratio_to_none"] = result["median_ms"] / (statistics.median(base) * 1000)
        result["p90_ratio_to_none"] = result["p90_ms"] / (_percentile(base, 0.9) * 1000)
    return result


def block_row(block: dict) -> dict:
    """What summary.json keeps of a block: its numbers, not its every reading."""
    latencies = block["latencies_s"]
    return {
        "arm": block["arm"],
        "block": block["block"],
        "requests": len(latencies),
        "median_ms": statistics.median(latencies) * 1000 if latencies else None,
        "p90_ms": _percentile(latencies, 0.9) * 1000 if latencies else None,
        "peak_reserved_bytes": block["peak_reserved"],
        "nvml_process_bytes": _peak_mean(block["process"]),
        "trims": block["trims"],
        "trim_released_bytes": block["trim_released_bytes"],
        "stage_end_wakes": block["stage_end_wakes"],
        "empty_cache_calls": block["empty_cache_calls"],
        "wall_s": block["wall_s"],
    }


def analysed(journal: str) -> dict | str:
    """What `vlmtrace report` reads from the journal: the trims' and empty_cache calls' cost on the
    requests after them (where the analysis libraries are installed)."""
    try:
        from vlmtrace.analysis.pipeline import analyze
        from vlmtrace.analysis.readers.detect import read_inputs

        summary = analyze(read_inputs([journal])).summary
    except Exception as error:  # noqa: BLE001 - the arm's measurements are kept whatever the analysis does
        return f"not analysed here ({type(error).__name__}: {error}): run vlmtrace report on the journal"
    return {
        "cache_trims": summary.cache_trims,
        "empty_cache": summary.empty_cache,
        "leak_found": summary.leak_found,
        "verdicts": {v.component: v.klass for v in summary.verdicts},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory: OUT/summary.json, OUT/journals.tar.gz")
    parser.add_argument(
        "--arms",
        default="none,guard=512MiB,guard=1GiB,empty_cache",
        help=f"comma-separated arms, of {', '.join(ARM_KINDS)} (guard=SIZE: a guard arm with that bound; "
        "guard=SIZE@MS: and that trim_cache_interval_ms)",
    )
    parser.add_argument("--blocks", type=int, default=20, help="rounds: blocks per arm")
    parser.add_argument("--per-block", type=int, default=100, help="timed requests per block (one image prompt each)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed requests at the start of every block")
    parser.add_argument("--order", choices=("rotate", "random"), default="rotate", help="the arms' order in each round")
    parser.add_argument("--trim-cache", default="512MiB", help="plain `guard`'s trim_cache (a size, or headroom=SIZE)")
    parser.add_argument("--trim-interval-ms", type=int, default=0, help="the guard arms' trim_cache_interval_ms")
    parser.add_argument("--sample-interval-ms", type=int, default=100, help="every arm's sample_interval_ms")
    parser.add_argument(
        "--deadline",
        type=float,
        default=420,
        help="seconds from the start (model load included) after which no round ends",
    )
    parser.add_argument(
        "--analyse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="analyse each arm's last journal as vlmtrace report does",
    )
    parser.add_argument("--image-sizes", type=int, default=24, help="distinct seeded images (60 px to --max-side)")
    parser.add_argument("--max-side", type=int, default=900)
    parser.add_argument("--tower", default="1152,16,4", help="the torch tower's width,heads,layers")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--model", metavar="DIR", help="model directory (default: $VLMTRACE_TINY_VLM)")
    parser.add_argument(
        "--standin", action="store_true", help="CPU: stand-in TurboMind engine, tiny tower (plumbing only)"
    )
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [
        arm for arm in arms if arm.partition("=")[0] not in ARM_KINDS or ("=" in arm and not arm.startswith("guard="))
    ]
    if unknown:
        parser.error(
            f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARM_KINDS)}, guard=SIZE or guard=SIZE@MS"
        )
    if len(set(arms)) != len(arms):
        parser.error("an arm is named twice")
    for arm in arms:
        try:
            Options.resolve(arm_options(arm, args), environ={}, strict=True)
        except (TypeError, ValueError) as error:
            parser.error(f"arm {arm}: {error}")
    return args


def done_when(arms: dict[str, dict]) -> dict:
    """The guard's acceptance test, per guard arm with a size bound: torch's peak at most `empty_cache`'s (what one
    request needs from an empty cache) plus the bound, and the median round ratio to `none` within 1 %."""
    cure = (arms.get("empty_cache") or {}).get("torch_reserved_bytes", {}).get("peak")
    checks = {}
    for arm, result in arms.items():
        bound = CacheBound.parse("trim_cache", result["options"].get("trim_cache"))
        ratio = (result.get("block_median_ratio_to_none") or {}).get("median")
        peak = result["torch_reserved_bytes"]["peak"]
        if bound is None or bound.kind != CACHED or ratio is None:
            continue
        over = peak - cure if peak is not None and cure is not None else None
        checks[arm] = {
            "peak_over_empty_cache_bytes": over,
            "bound_bytes": bound.limit_bytes,
            "peak_bounded": over <= bound.limit_bytes if over is not None else None,
            "median_ratio": ratio,
            "median_at_most_1_percent_slower": ratio <= 1.01,
        }
    return checks


def write_summary(
    args: argparse.Namespace, blocks: dict[str, list[dict]], progress: dict, analyses: dict | None = None
) -> dict:
    """OUT/summary.json, rewritten after every round: a run cut short by its `timeout` keeps the rounds
    that ended."""
    baseline = blocks.get("none")
    summary = {
        "arms": {
            arm: summarise_arm(arm, arm_blocks, baseline if arm != "none" else None, args)
            for arm, arm_blocks in blocks.items()
        },
        **progress,
        "arguments": {key: value for key, value in vars(args).items() if key != "out"},
        "blocks": [block_row(block) for arm_blocks in blocks.values() for block in arm_blocks],
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
    }
    for arm, analysis in (analyses or {}).items():
        summary["arms"][arm]["analysis"] = analysis
    summary["done_when"] = done_when(summary["arms"])
    path = os.path.join(args.out, "summary.json")
    with open(path + ".part", "w") as handle:
        json.dump(summary, handle, indent=1, default=str)
    os.replace(path + ".part", path)
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    began = time.perf_counter()
    arms = args.arms.split(",")
    os.makedirs(args.out, exist_ok=True)
    dim, heads, layers = (int(part) for part in args.tower.split(","))
    device = "cpu" if args.standin else "cuda"
    if args.standin:
        dim, heads, layers = 32, 2, 1
    blocks: dict[str, list[dict]] = {arm: [] for arm in arms}
    progress = {"rounds": 0, "stopped": "running", "round_seconds": []}
    with workload_engine(args), tempfile.TemporaryDirectory() as journals:
        tower = TorchVisionTower(dim, heads, layers, device)
        install_tower(tower)
        pipe = build_pipeline("turbomind")
        memory = DeviceMemory()
        images = ImageSet(args.image_sizes, seed=args.seed, draw_seed=args.seed + 1, max_side=args.max_side)
        # Every image once before any block: the tower's kernels for each shape are chosen on first use,
        # which would otherwise fall on whichever arm meets the shape first.
        for image in images.images:
            pipe([("describe this image", image)], gen_config=generation_config())
        progress["stopped"] = "all rounds ran"
        for index in range(args.blocks):
            elapsed = time.perf_counter() - began
            if progress["round_seconds"] and elapsed + max(progress["round_seconds"]) > args.deadline:
                progress["stopped"] = (
                    f"deadline: round {index} would end after {args.deadline:.0f} s ({elapsed:.0f} s gone)"
                )
                break
            plan = round_plan(images, index, args.warmup + args.per_block, args.seed)
            round_began = time.perf_counter()
            for arm in round_order(arms, index, args):
                block = run_block(arm, index, plan, pipe, tower, images, args, memory, journals)
                blocks[arm].append(block)
                print(json.dumps(block_row(block)), flush=True)
            progress["round_seconds"].append(time.perf_counter() - round_began)
            progress["rounds"] = index + 1
            progress["seconds"] = time.perf_counter() - began
            write_summary(args, blocks, progress)
        pipe.close()
        analyses = {arm: analysed(blocks[arm][-1]["journal"]) for arm in arms if args.analyse and blocks[arm]}
        with tarfile.open(os.path.join(args.out, "journals.tar.gz"), "w:gz") as packed:
            packed.add(journals, arcname="journals")
    progress["seconds_with_analysis"] = time.perf_counter() - began
    summary = write_summary(args, blocks, progress, analyses)
    print(
        json.dumps(
            {
                arm: {
                    key: summary["arms"][arm].get(key)
                    for key in ("requests", "median_ms", "block_median_ratio_to_none", "torch_reserved_bytes", "trims")
                }
                for arm in arms
            },
            default=str,
        )
    )
    print(json.dumps({"done_when": summary["done_when"]}))
    print(json.dumps({key: progress.get(key) for key in ("rounds", "stopped", "seconds_with_analysis")}))


if __name__ == "__main__":
    main()
