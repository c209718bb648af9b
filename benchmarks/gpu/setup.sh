# Source at the start of every command on the lent GPU machine (see benchmarks/gpu/README.md):
# LMDeploy 0.18 and the tiny Qwen2-VL (../shared/gpu recipe, staged in .gpu/), vlmtrace's own
# wheels for Python 3.12 (staged in .whl/ by benchmarks/gpu/stage.sh), and vlmtrace from src/ with its
# compiled core built in place by the device's gcc (setup.py, with the staged setuptools) and the compiled
# read of torch's counters built for the device's torch, once per machine.
if [ -f .gpu/on-device.sh ]; then source .gpu/on-device.sh || return 1; else source /tmp/vt-site/on-device.sh || return 1; fi
if [ -d .whl ] && [ ! -f /tmp/vt-site/.vlmtrace-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --upgrade \
      --target /tmp/vt-site .whl/*.whl && touch /tmp/vt-site/.vlmtrace-wheels || return 1
fi
export PYTHONPATH="$PWD/src:$PWD/benchmarks:$PYTHONPATH"
if ! python3 -c 'import vlmtrace._core, vlmtrace.probes.heap as h; assert h.library_path()' 2>/dev/null; then
  python3 setup.py -q build_ext --inplace --build-temp /tmp/vt-core-build >/tmp/vt-core-build.log 2>&1 \
      || { tail -n 5 /tmp/vt-core-build.log; echo "vlmtrace's compiled core did not build"; return 1; }
fi
if [ ! -f /tmp/vt-site/.vlmtrace-torch-counters ]; then
  python3 -c 'from vlmtrace.probes import native_counters; print("torch counters:", native_counters.build())' \
      && touch /tmp/vt-site/.vlmtrace-torch-counters
fi
python3 -c 'import vlmtrace, orjson, pynvml, torch; print("vlmtrace", vlmtrace.__version__, "torch", torch.__version__, "gpus", torch.cuda.device_count())'
