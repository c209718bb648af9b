#!/usr/bin/env bash
# GPU measurements and recordings in as few calls as device time allows:
#   source benchmarks/gpu/setup.sh && bash benchmarks/gpu/evidence.sh "$OUT" [STEP...]
# With no STEP it runs them all (more than one 600 s call: pass a subset per call). Each step has its
# own time limit and packs its results into $OUT/<step>.tar.gz as soon as it ends, so a step that fails,
# or a run cut short, loses only what had not finished.
set -u
out=${1:?usage: evidence.sh OUT [STEP...]}
shift
all=(scenarios-turbomind crash-turbomind scenarios-pytorch crash-pytorch api-server overhead-turbomind overhead-turbomind-switch1ms overhead-pytorch ablation-turbomind crash-pytorch-native-handlers)
# Steps are grouped into calls whose limits add up to under 600 s (README.md):
#   evidence.sh OUT matrix-26
#   evidence.sh OUT procs-tiny-turbomind
#   evidence.sh OUT make-2b procs-2b-pytorch
#   evidence.sh OUT make-2b cost-2b-pytorch-heap
owed=(make-2b matrix-26 cost-2b-pytorch-heap procs-tiny-turbomind procs-2b-pytorch)
steps=("${@:-${all[@]}}")
work=/tmp/vlmtrace-evidence
rm -rf "$work" && mkdir -p "$work"
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  mkdir -p "$work/$name"
  timeout "$limit" "$@" > "$work/$name/log.txt" 2>&1
  local status=$?
  echo "$name: exit $status after $((SECONDS - started)) s, at $(date +%s.%N)"
  tar czf "$out/$name.tar.gz" -C "$work/$name" .
}
for name in "${steps[@]}"; do
  case $name in
    scenarios-turbomind) step "$name" 120 python3 benchmarks/gpu_scenarios.py --backend turbomind --calls 80 --out "$work/$name" ;;
    scenarios-pytorch) step "$name" 180 python3 benchmarks/gpu_scenarios.py --backend pytorch --calls 80 --out "$work/$name" ;;
    crash-turbomind) step "$name" 60 python3 benchmarks/gpu_scenarios.py --backend turbomind --out "$work/$name" --crash ;;
    crash-pytorch) step "$name" 75 python3 benchmarks/gpu_scenarios.py --backend pytorch --out "$work/$name" --crash ;;
    api-server) step "$name" 200 python3 benchmarks/gpu_api_server.py "$work/$name/run" --backend pytorch ;;
    overhead-turbomind) step "$name" 150 python3 benchmarks/gpu_overhead.py --backend turbomind --rounds 50 --variant vlmtrace-again= --variant nojournal=journal:off --json "$work/$name/result.json" ;;
    overhead-turbomind-switch1ms) step "$name" 120 python3 benchmarks/gpu_overhead.py --backend turbomind --rounds 30 --switch-interval 0.001 --json "$work/$name/result.json" ;;
    overhead-pytorch) step "$name" 150 python3 benchmarks/gpu_overhead.py --backend pytorch --rounds 8 --per-round 10 --memory-history --json "$work/$name/result.json" ;;
    crash-pytorch-native-handlers) step "$name" 75 python3 benchmarks/gpu_scenarios.py --backend pytorch --out "$work/$name" --crash --keep-native-handlers ;;
    ablation-turbomind) step "$name" 200 python3 benchmarks/gpu_ablation.py --backend turbomind --rounds 30 --json "$work/$name/result.json" ;;
    matrix-23) step "$name" 360 python3 benchmarks/gpu_matrix.py run --half held_out_23 --out "$work/$name" --workers 8 --deadline 330 ;;
    matrix-24) step "$name" 360 python3 benchmarks/gpu_matrix.py run --half held_out_24 --out "$work/$name" --workers 8 --deadline 330 ;;
    matrix-25) step "$name" 290 python3 benchmarks/gpu_matrix.py run --half held_out_25 --out "$work/$name" --workers 8 --deadline 260 ;;
    matrix-26) step "$name" 280 python3 benchmarks/gpu_matrix.py run --half held_out_26 --out "$work/$name" --workers 8 --deadline 250 ;;
    make-2b) [ -d /tmp/q2b ] || step "$name" 60 python3 /tmp/vt-site/make_2b_qwen2vl.py "$VLMTRACE_TINY_VLM" /tmp/q2b ;;
    cost-tiny-turbomind) step "$name" 90 python3 benchmarks/gpu_overhead.py --backend turbomind --rounds 40 --json "$work/$name/result.json" ;;
    cost-2b-turbomind) step "$name" 150 python3 benchmarks/gpu_overhead.py --backend turbomind --model /tmp/q2b --rounds 40 --json "$work/$name/result.json" ;;
    cost-tiny-pytorch) step "$name" 150 python3 benchmarks/gpu_overhead.py --backend pytorch --rounds 30 --per-round 10 --json "$work/$name/result.json" ;;
    cost-2b-pytorch) step "$name" 190 python3 benchmarks/gpu_overhead.py --backend pytorch --model /tmp/q2b --rounds 30 --per-round 10 --json "$work/$name/result.json" ;;
    # The whole process started with the heap counter, both arms: what the stage charges add on top of it.
    cost-tiny-turbomind-heap) step "$name" 90 env LD_PRELOAD="$(python3 -m vlmtrace.probes.heap)" python3 benchmarks/gpu_overhead.py --backend turbomind --rounds 40 --json "$work/$name/result.json" ;;
    cost-2b-pytorch-heap) step "$name" 190 env LD_PRELOAD="$(python3 -m vlmtrace.probes.heap)" python3 benchmarks/gpu_overhead.py --backend pytorch --model /tmp/q2b --rounds 30 --per-round 10 --json "$work/$name/result.json" ;;
    # Fresh processes, one per arm, alternated (README.md, "What vlmtrace costs"): a command each.
    procs-tiny-turbomind) step "$name" 560 python3 benchmarks/gpu_overhead_processes.py --backend turbomind --pairs 8 --deadline 540 --json "$work/$name/result.json" ;;
    procs-2b-pytorch) step "$name" 500 python3 benchmarks/gpu_overhead_processes.py --backend pytorch --model /tmp/q2b --pairs 8 --batches 30 --deadline 420 --json "$work/$name/result.json" ;;
    # The event loop's CPU per batch by wrapper role (docs/performance.md): where a cut would act.
    roles-tiny-turbomind) step "$name" 120 python3 benchmarks/gpu_ablation.py --backend turbomind --rounds 16 --ablation null-wrappers --ablation unrecorded-all --ablation no-journal --ablation unwrapped-request.preprocess --ablation unwrapped-vision.preprocess --ablation unwrapped-turbomind.stream --json "$work/$name/result.json" ;;
    roles-tiny-pytorch) step "$name" 180 python3 benchmarks/gpu_ablation.py --backend pytorch --rounds 10 --per-round 8 --ablation null-wrappers --ablation unrecorded-all --ablation no-journal --ablation unwrapped-request.preprocess --ablation unwrapped-vision.preprocess --ablation unwrapped-pytorch.forward --json "$work/$name/result.json" ;;
    roles-2b-pytorch) step "$name" 240 python3 benchmarks/gpu_ablation.py --backend pytorch --model /tmp/q2b --rounds 10 --per-round 8 --ablation null-wrappers --ablation unrecorded-all --ablation no-journal --ablation unwrapped-request.preprocess --ablation unwrapped-vision.preprocess --ablation unwrapped-pytorch.forward --json "$work/$name/result.json" ;;
    *) echo "unknown step $name (known: ${all[*]} ${owed[*]})" ;;
  esac
done
grep -h '"median_ratio"\|"scenario"\|aborting\|"error"' "$work"/*/log.txt | head -40
