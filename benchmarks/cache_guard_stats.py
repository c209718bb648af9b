"""How sure gpu_cache_guard.py's latency ratios are: one point per arm is not enough to judge "within 1 %".

    python3 benchmarks/cache_guard_stats.py OUT/guard [--json stats.json] [--baseline empty_cache]

Reads OUT/summary.json and the journals in OUT/journals.tar.gz (or an extracted OUT/journals/). Per
arm against `none`, four estimates of the latency ratio, each with a 95 % bootstrap interval that
resamples whole rounds (requests in one block share its moment on the machine, so they are not
independent); `--baseline` compares with another arm instead:
- `block_median`: the median of the rounds' block-median ratios (the summary's, what `done_when` tests);
- `pooled_median`: the median of all the arm's timed requests over `none`'s;
- `paired_median`: the median, over every request, of its latency over the same request's in `none`'s
  block of the round (every arm of a round sends the same seeded images in the same order);
- `mean`: mean latency over `none`'s.
Also the block ratios' quartiles and how many rounds the arm was the slower in. A request's latency
here is its `lmdeploy.pipeline.infer` span (the benchmark times the call around it, ~0.1 ms more);
the first `--warmup` spans of a block are dropped as the benchmark drops them.

`near_trims`, for an arm with trims (its journals' `vlmtrace.cache.trim` spans): each request's paired
ratio as above, split into those next to a trim (overlapped by one, or the first to start after one)
and the rest; the medians of both, and the trims' share of the arm's latency estimated from them: the near
requests' share of all, times how much slower they were than the rest. Comparing requests of the same
arm, it is blind to what moves a whole block (which the four ratios above carry as noise), and it
counts only what a trim costs the two requests next to it. (The report, with no request to pair with,
compares the first requests after a trim with the others only: the guard trims as a heavy request's
vision stage ends, so the requests it overlaps are slower anyway.)
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import statistics
import tarfile
from typing import NamedTuple

import numpy as np

from vlmtrace.analysis.step4_outlook.empty_cache import requests_following, requests_overlapped

PIPELINE_SPAN = "lmdeploy.pipeline.infer"
TRIM_SPAN = "vlmtrace.cache.trim"


class Block(NamedTuple):
    latencies: list[float]  # seconds, the timed requests in the order they were sent
    near_trim: list[bool]  # per timed request: a trim overlapped it, or it started first after one


def read_block(lines, warmup: int) -> Block:
    requests, trims = [], []
    for line in lines:
        if PIPELINE_SPAN in line or TRIM_SPAN in line:
            record = json.loads(line)
            if record.get("k") == "end" and record.get("name") in (PIPELINE_SPAN, TRIM_SPAN):
                (requests if record["name"] == PIPELINE_SPAN else trims).append((record["start"], record["t"]))
    requests.sort()
    starts, ends = (np.array([span[i] for span in requests], dtype=np.int64) for i in (0, 1))
    trim_starts, trim_ends = (np.array([span[i] for span in trims], dtype=np.int64) for i in (0, 1))
    near = (requests_following(trim_ends, starts) | requests_overlapped(trim_starts, trim_ends, starts, ends)).tolist()
    return Block([(end - start) / 1e9 for start, end in requests][warmup:], near[warmup:])


def read_journals(out: str, warmup: int) -> dict[str, dict[int, Block]]:
    """{block directory's arm name: {round: block}} from journals.tar.gz or journals/."""
    found: dict[str, dict[int, Block]] = {}

    def add(path: str, lines) -> None:
        block, arm = os.path.basename(os.path.dirname(path)).split("-", 1)
        found.setdefault(arm, {})[int(block[1:])] = read_block(lines, warmup)

    archive = os.path.join(out, "journals.tar.gz")
    if os.path.exists(archive):
        with tarfile.open(archive) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".jsonl"):
                    add(member.name, io.TextIOWrapper(tar.extractfile(member), encoding="utf-8"))
    else:
        for root, _, files in os.walk(os.path.join(out, "journals")):
            for name in files:
                if name.endswith(".jsonl"):
                    with open(os.path.join(root, name), encoding="utf-8") as handle:
                        add(os.path.join(root, name), handle)
    return found


def _ratios(arm: dict[int, list[float]], base: dict[int, list[float]], rounds: list[int]) -> dict[str, float]:
    mine = [value for r in rounds for value in arm[r]]
    theirs = [value for r in rounds for value in base[r]]
    paired = [math.log(a / b) for r in rounds for a, b in zip(arm[r], base[r])]
    return {
        "block_median": statistics.median(statistics.median(arm[r]) / statistics.median(base[r]) for r in rounds),
        "pooled_median": statistics.median(mine) / statistics.median(theirs),
        "paired_median": math.exp(statistics.median(paired)),
        "mean": statistics.fmean(mine) / statistics.fmean(theirs),
    }


def _near_trims(arm: dict[int, Block], base: dict[int, Block], rounds: list[int]) -> dict[str, float] | None:
    near, rest = [], []
    for r in rounds:
        for mine, theirs, close in zip(arm[r].latencies, base[r].latencies, arm[r].near_trim):
            (near if close else rest).append(mine / theirs)
    if not near or not rest:
        return None
    near_median, rest_median = statistics.median(near), statistics.median(rest)
    share = len(near) / (len(near) + len(rest))
    return {
        "share_of_requests": share,
        "near_median": near_median,
        "rest_median": rest_median,
        "cost_of_trims": share * (near_median / rest_median - 1),
    }


def _interval(samples: list[dict | None], name: str) -> list[float] | None:
    ordered = sorted(sample[name] for sample in samples if sample is not None)
    return [ordered[int(0.025 * len(ordered))], ordered[int(0.975 * len(ordered)) - 1]] if ordered else None


def estimate(arm: dict[int, Block], base: dict[int, Block], resamples: int, seed: int) -> dict:
    rounds = sorted(set(arm) & set(base))
    latencies = {r: arm[r].latencies for r in rounds}
    base_latencies = {r: base[r].latencies for r in rounds}
    point = _ratios(latencies, base_latencies, rounds)
    draw = random.Random(seed)
    draws = [draw.choices(rounds, k=len(rounds)) for _ in range(resamples)]
    samples = [_ratios(latencies, base_latencies, chosen) for chosen in draws]
    result: dict = {}
    near = _near_trims(arm, base, rounds)
    if near is not None:
        near_samples = [_near_trims(arm, base, chosen) for chosen in draws]
        result["near_trims"] = {**near, "cost_of_trims_interval_95": _interval(near_samples, "cost_of_trims")}
    for name, value in point.items():
        ordered = sorted(sample[name] for sample in samples)
        result[name] = {
            "ratio": value,
            "interval_95": [ordered[int(0.025 * resamples)], ordered[int(0.975 * resamples) - 1]],
        }
    blocks = [statistics.median(latencies[r]) / statistics.median(base_latencies[r]) for r in rounds]
    quartiles = statistics.quantiles(blocks, n=4)
    result["block_ratio_quartiles"] = [quartiles[0], quartiles[2]]
    result["rounds_slower"] = sum(ratio > 1 for ratio in blocks)
    result["rounds"] = len(rounds)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="gpu_cache_guard.py's --out directory")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the estimates here")
    parser.add_argument(
        "--baseline", default="none", help="the arm every other is compared with (its journal name: guard-1GiB)"
    )
    args = parser.parse_args(argv)
    with open(os.path.join(args.out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    journals = read_journals(args.out, summary["arguments"]["warmup"])
    base = journals.pop(args.baseline)
    stats = {arm: estimate(blocks, base, args.resamples, args.seed) for arm, blocks in sorted(journals.items())}
    for arm, result in stats.items():
        print(
            f"{arm}  ({result['rounds_slower']}/{result['rounds']} rounds slower than {args.baseline}; block ratios' "
            f"quartiles {result['block_ratio_quartiles'][0]:.3f}-{result['block_ratio_quartiles'][1]:.3f})"
        )
        for name in ("block_median", "pooled_median", "paired_median", "mean"):
            low, high = result[name]["interval_95"]
            print(f"  {name:14s} {result[name]['ratio']:.4f}  [{low:.3f}, {high:.3f}]")
        near = result.get("near_trims")
        if near is not None:
            low, high = near["cost_of_trims_interval_95"]
            print(
                f"  near trims     {near['share_of_requests']:.1%} of requests, {near['near_median']:.3f} against "
                f"{near['rest_median']:.3f} for the rest: the trims' cost {near['cost_of_trims']:+.2%} [{low:+.2%}, {high:+.2%}]"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(stats, handle, indent=1)


if __name__ == "__main__":
    main()
