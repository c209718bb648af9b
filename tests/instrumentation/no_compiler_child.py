"""An instrumented LMDeploy pipeline (the real Python over the stand-in TurboMind engine) that serves one
image request, then aborts while a second one streams: its spans are in flight.

Usage: no_compiler_child.py JOURNAL ABORT, ABORT `os` (os.abort) or `libc` (libc's abort through ctypes).
Prints `served` once the first request is answered; the abort comes well after the in-flight spans'
start records (the journal's time bound is 10 ms)."""

from __future__ import annotations

import ctypes
import os
import sys
import time

from PIL import Image

import vlmtrace
from tests.support.cpu_lmdeploy import cpu_lmdeploy, tiny_vlm_path

SETTLE_S = 0.3


def main(journal: str, abort: str) -> None:
    vlmtrace.instrument(journal=journal)
    from lmdeploy import GenerationConfig, TurbomindEngineConfig, pipeline

    with cpu_lmdeploy(token_seconds=0.01):
        pipe = pipeline(
            tiny_vlm_path(), backend_config=TurbomindEngineConfig(session_len=2048, max_batch_size=4), log_level="ERROR"
        )
        image = Image.new("RGB", (64, 64), "white")
        pipe([("describe", image)], gen_config=GenerationConfig(max_new_tokens=4))
        print("served", flush=True)
        outputs = pipe.stream_infer(
            [("describe", image)], gen_config=GenerationConfig(max_new_tokens=1000, ignore_eos=True)
        )
        next(iter(outputs))  # the request streams: its spans are open
        time.sleep(SETTLE_S)
        if abort == "libc":
            ctypes.CDLL(None).abort()
        os.abort()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
