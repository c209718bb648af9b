# Source at the start of every command on the lent GPU machine (see benchmarks/gpu/README.md):
# LMDeploy 0.18 and the tiny Qwen2-VL (../shared/gpu recipe, staged in .gpu/), vlmtrace's own
# wheels for Python 3.12 (staged in .whl/ by benchmarks/gpu/stage.sh), and vlmtrace from src/.
if [ -f .gpu/on-device.sh ]; then source .gpu/on-device.sh || return 1; else source /tmp/vt-site/on-device.sh || return 1; fi
if [ -d .whl ] && [ ! -f /tmp/vt-site/.vlmtrace-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --upgrade \
      --target /tmp/vt-site .whl/*.whl && touch /tmp/vt-site/.vlmtrace-wheels || return 1
fi
export PYTHONPATH="$PWD/src:$PWD/benchmarks:$PYTHONPATH"
python3 -c 'import vlmtrace, orjson, pynvml, torch; print("vlmtrace", vlmtrace.__version__, "torch", torch.__version__, "gpus", torch.cuda.device_count())'
