#!/usr/bin/env bash
# Every GPU measurement and recording in one call (device time is scarce):
#   source benchmarks/gpu/setup.sh && bash benchmarks/gpu/evidence.sh "$OUT"
# Writes $OUT/evidence.tar.gz: overhead JSON, probe costs, scenario journals per backend, the crash
# journal, and the api_server run when its script exists. Each step has its own time limit, so one
# failure costs that step only.
set -u
out=${1:?usage: evidence.sh OUT}
work=/tmp/vlmtrace-evidence
rm -rf "$work" && mkdir -p "$work"
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - started)) s"
}
step probe_cost 60 python3 benchmarks/probe_cost.py --json "$work/probe_cost.json"
step overhead-turbomind 90 python3 benchmarks/gpu_overhead.py --backend turbomind --rounds 12 --json "$work/overhead-turbomind.json"
step overhead-pytorch 120 python3 benchmarks/gpu_overhead.py --backend pytorch --rounds 6 --per-round 10 --json "$work/overhead-pytorch.json"
step scenarios-turbomind 90 python3 benchmarks/gpu_scenarios.py --backend turbomind --out "$work/journals"
step scenarios-pytorch 150 python3 benchmarks/gpu_scenarios.py --backend pytorch --out "$work/journals"
step crash-turbomind 60 python3 benchmarks/gpu_scenarios.py --backend turbomind --out "$work/journals" --crash
if [ -f benchmarks/gpu_api_server.py ]; then
  step api-server 150 python3 benchmarks/gpu_api_server.py --out "$work/api_server"
fi
grep -h '"median_ratio"\|"paired_median_ratio"\|"scenario"' "$work"/*.log | head -40
tar czf "$out/evidence.tar.gz" -C "$work" .
ls -la "$out"
