#!/usr/bin/env bash
# Same host, same benchmark, two versions of vlmtrace: this checkout's and an older one's src/.
#   git archive COMMIT src | tar -x -C old && source benchmarks/gpu/setup.sh
#   bash benchmarks/gpu/compare_versions.sh OUT old [ROUNDS]
# Runs the TurboMind overhead benchmark (plain against vlmtrace) four times, this version and the
# other in turn, so that host-to-host differences (plain medians of 15-22 ms between lent machines)
# stay out of the comparison; then once more with this version and no warm-up batch per block.
set -u
out=${1:?usage: compare_versions.sh OUT OLD_DIR [ROUNDS]}
other=${2:?usage: compare_versions.sh OUT OLD_DIR [ROUNDS]}
rounds=${3:-25}
run() {  # run NAME SRC [ARGS...]
  local name=$1 src=$2; shift 2
  PYTHONPATH="$src:$PWD/benchmarks:$PYTHONPATH" timeout 150 python3 benchmarks/gpu_overhead.py --backend turbomind \
    --rounds "$rounds" --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name: exit $? $(grep -h '"median_ratio"\|"paired_median_ratio"' "$out/$name.json" | tr -d ' \n')"
}
for i in 1 2; do
  run "this-$i" "$PWD/src"
  run "other-$i" "$PWD/$other/src"
done
run "this-no-warmup" "$PWD/src" --warmup 0
