#!/usr/bin/env bash
# Every GPU measurement and recording in one call (device time is scarce):
#   source benchmarks/gpu/setup.sh && bash benchmarks/gpu/evidence.sh "$OUT"
# Each step has its own time limit and packs its results into $OUT/<step>.tar.gz as soon as it ends,
# so a step that fails, or a run cut short, loses only what had not finished. Most important first.
set -u
out=${1:?usage: evidence.sh OUT}
work=/tmp/vlmtrace-evidence
rm -rf "$work" && mkdir -p "$work"
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  mkdir -p "$work/$name"
  timeout "$limit" "$@" > "$work/$name/log.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - started)) s"
  tar czf "$out/$name.tar.gz" -C "$work/$name" .
}
step scenarios-turbomind 90 python3 benchmarks/gpu_scenarios.py --backend turbomind --calls 80 --out "$work/scenarios-turbomind"
step crash-turbomind 60 python3 benchmarks/gpu_scenarios.py --backend turbomind --out "$work/crash-turbomind" --crash
step scenarios-pytorch 150 python3 benchmarks/gpu_scenarios.py --backend pytorch --calls 80 --out "$work/scenarios-pytorch"
step overhead-turbomind 75 python3 benchmarks/gpu_overhead.py --backend turbomind --rounds 12 --json "$work/overhead-turbomind/result.json"
if [ -f benchmarks/gpu_api_server.py ]; then
  step api-server 200 python3 benchmarks/gpu_api_server.py "$work/api-server/run" --backend pytorch
fi
step overhead-pytorch 90 python3 benchmarks/gpu_overhead.py --backend pytorch --rounds 4 --per-round 10 --json "$work/overhead-pytorch/result.json"
grep -h '"median_ratio"\|"scenario"\|aborting' "$work"/*/log.txt | head -40
