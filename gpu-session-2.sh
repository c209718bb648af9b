set -o pipefail
export PYTHONUNBUFFERED=1
cat .gpu/parts/a .gpu/parts/b > .gpu/lmdeploy-0.18.0.tar.xz && rm -rf .gpu/parts
source benchmarks/gpu/setup.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/machine.txt
timeout 250 python3 benchmarks/gpu_capture.py /tmp/capture --backends pytorch 2>&1 | tail -n 60 | tee $OUT/capture.log
cp /tmp/capture/summary.json $OUT/capture-summary.json 2>/dev/null
tar czf $OUT/capture.tar.gz -C /tmp capture
ls -la $OUT
