#!/usr/bin/env bash
# Run here (not on the GPU machine): stage LMDeploy + the tiny VLM (.gpu/, from ../shared/gpu) and
# vlmtrace's runtime wheels for the device's Python 3.12 (.whl/), with the setuptools that builds vlmtrace's
# compiled core there (setup.py, by the device's gcc). Both folders are git-ignored. (The compiled counter
# read, probes/native_counters.py, needs only torch's own headers with the device's torch.)
# `stage.sh profile` adds py-spy (3 MB) for gpu_profile.py. A device run carries at most 64 MiB with the
# repository's own files (~34 MB), so .gpu/ (57 MB) travels over two calls: LMDeploy's archive is split
# into .gpu/parts/a (4.5 MB, with the first call) and .gpu/parts/b (the rest, with the second; README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=$([ "${1:-}" = profile ] && echo 1 || true)
[ -f .gpu/lmdeploy-0.18.0.tar.xz ] || bash ../shared/gpu/prepare.sh
grep -qxF "/.whl/" .git/info/exclude || echo "/.whl/" >> .git/info/exclude
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl orjson==3.13.0 nvidia-ml-py==13.615.71 setuptools==84.2.1 ${profile:+py-spy==0.4.3}
mkdir -p .gpu/parts
head -c 4500000 .gpu/lmdeploy-0.18.0.tar.xz > .gpu/parts/a
tail -c +4500001 .gpu/lmdeploy-0.18.0.tar.xz > .gpu/parts/b
du -sh .gpu .whl
