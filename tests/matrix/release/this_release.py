"""Which release this process runs (set by `test_releases.py`), and what its checks share."""

from __future__ import annotations

import os

RELEASE = os.environ["VLMTRACE_MATRIX_RELEASE"]
FAMILY = os.environ["VLMTRACE_MATRIX_FAMILY"]  # the target family vlmtrace must choose for it
LEGACY = FAMILY == "0.4–0.6.4"
VISION_MAX_BATCH = 2


def vision_config(max_batch_size: int):
    from lmdeploy import messages

    config = getattr(messages, "VisionConfig", None) or messages.VisonConfig  # 0.4 spells it VisonConfig
    return config(max_batch_size=max_batch_size)
