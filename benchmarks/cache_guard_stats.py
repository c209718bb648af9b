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

PIPELINE_SPAN = "lmdeploy.pipeline.infer"


def block_latencies(lines, warmup: int) -> list[float]:
    """A block's timed request latencies, in the order the requests were sent."""
    spans = []
    for line in lines:
        if PIPELINE_SPAN in line:
            record = json.loads(line)
            if record.get("k") == "end" and record.get("name") == PIPELINE_SPAN:
                spans.append((record["start"], (record["t"] - record["start"]) / 1e9))
    return [seconds for _, seconds in sorted(spans)][warmup:]


def read_journals(out: str, warmup: int) -> dict[str, dict[int, list[float]]]:
    """{block directory's arm name: {round: latencies}} from journals.tar.gz or journals/."""
    found: dict[str, dict[int, list[float]]] = {}

    def add(path: str, lines) -> None:
        block, arm = os.path.basename(os.path.dirname(path)).split("-", 1)
        found.setdefault(arm, {})[int(block[1:])] = block_latencies(lines, warmup)

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
    return {"block_median": statistics.median(statistics.median(arm[r]) / statistics.median(base[r]) for r in rounds),
            "pooled_median": statistics.median(mine) / statistics.median(theirs),
            "paired_median": math.exp(statistics.median(paired)),
            "mean": statistics.fmean(mine) / statistics.fmean(theirs)}


def estimate(arm: dict[int, list[float]], base: dict[int, list[float]], resamples: int, seed: int) -> dict:
    rounds = sorted(set(arm) & set(base))
    point = _ratios(arm, base, rounds)
    draw = random.Random(seed)
    samples = [_ratios(arm, base, draw.choices(rounds, k=len(rounds))) for _ in range(resamples)]
    result = {}
    for name, value in point.items():
        ordered = sorted(sample[name] for sample in samples)
        result[name] = {"ratio": value, "interval_95": [ordered[int(0.025 * resamples)], ordered[int(0.975 * resamples) - 1]]}
    blocks = [statistics.median(arm[r]) / statistics.median(base[r]) for r in rounds]
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
    parser.add_argument("--baseline", default="none", help="the arm every other is compared with (its journal name: guard-1GiB)")
    args = parser.parse_args(argv)
    with open(os.path.join(args.out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    journals = read_journals(args.out, summary["arguments"]["warmup"])
    base = journals.pop(args.baseline)
    stats = {arm: estimate(blocks, base, args.resamples, args.seed) for arm, blocks in sorted(journals.items())}
    for arm, result in stats.items():
        print(f"{arm}  ({result['rounds_slower']}/{result['rounds']} rounds slower than {args.baseline}; block ratios' "
              f"quartiles {result['block_ratio_quartiles'][0]:.3f}-{result['block_ratio_quartiles'][1]:.3f})")
        for name in ("block_median", "pooled_median", "paired_median", "mean"):
            low, high = result[name]["interval_95"]
            print(f"  {name:14s} {result[name]['ratio']:.4f}  [{low:.3f}, {high:.3f}]")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(stats, handle, indent=1)


if __name__ == "__main__":
    main()
