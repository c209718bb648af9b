"""The columns of the normalised trace: which attributes the span, sample and device tables keep, in
which order, and how an absent time is written.
"""

from __future__ import annotations

import numpy as np

from vlmtrace import semconv as sc

MISSING_TIME = np.iinfo(np.int64).min

# Memory readings present on span end records and on samples (value at that moment).
MEM_VALUE_KEYS = (
    sc.MEM_TORCH_ALLOCATED,
    sc.MEM_TORCH_RESERVED,
    sc.MEM_TORCH_INACTIVE_SPLIT,
    sc.MEM_TORCH_ALLOC_RETRIES,
    sc.MEM_TORCH_OOMS,
    sc.MEM_GPU_PROCESS,
    sc.MEM_GPU_USED,
    sc.MEM_GPU_TOTAL,
    sc.MEM_NATIVE,
    sc.MEM_HOST_RSS,
    sc.MEM_READ_TIME,
)
# Deltas kept: those of the readings the components are made of, to place each span's start reading.
MEM_DELTA_KEYS = tuple(
    key + sc.DELTA_SUFFIX
    for key in (
        sc.MEM_TORCH_ALLOCATED,
        sc.MEM_TORCH_RESERVED,
        sc.MEM_GPU_PROCESS,
        sc.MEM_NATIVE,
        sc.MEM_HOST_RSS,
        sc.MEM_READ_TIME,
    )
)
# The heap counter's reading and its delta, only in processes started with it preloaded (probes/heap.py):
# the span table's last columns, looked up one by one (the fast path takes the keys every span has).
HEAP_KEYS = (sc.MEM_HOST_HEAP, sc.MEM_HOST_HEAP + sc.DELTA_SUFFIX)
# Input features and load facts, read from whichever span carries them.
FEATURE_KEYS = (
    sc.REQUEST_IMAGES,
    sc.REQUEST_IMAGE_PIXELS,
    sc.GEN_AI_USAGE_INPUT_TOKENS,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS,
    sc.VISION_IMAGES,
    sc.VISION_PIXELS,
    sc.VISION_TOKENS,
    sc.VISION_MAX_BATCH_SIZE,
    sc.PIPELINE_PROMPTS,
    sc.PIPELINE_IMAGES,
    sc.STEP_SEQUENCES,
    sc.STEP_TOKENS,
    sc.REQUEST_PREPROCESS_DURATION,
    *sc.PROMPT_END_KEYS.values(),
    *sc.RESPONSE_END_KEYS.values(),
    sc.REQUEST_DETAIL_SKIPPED,
)
SPAN_MEMORY_KEYS = MEM_VALUE_KEYS + MEM_DELTA_KEYS + HEAP_KEYS
NO_FEATURES = (float("nan"),) * len(FEATURE_KEYS)
# Stages whose spans carry input features; spans without a stage are checked by their GenAI attributes.
FEATURE_STAGES = frozenset({sc.STAGE_PIPELINE, sc.STAGE_REQUEST, sc.STAGE_VISION_PREPROCESS})
NO_SPAN = "(outside any span)"  # the stage of what no span of ours ran around
SAMPLE_NUMERIC_KEYS = (
    *MEM_VALUE_KEYS,
    sc.MEM_HOST_HEAP,
    sc.LMDEPLOY_TM_ACTIVE_SEQS,
    sc.LMDEPLOY_TM_WAITING_SEQS,
    sc.LMDEPLOY_TM_CACHE_USAGE,
)
# The heap counter's readings in a few processes' samples, each kept apart by row with the type it must have:
# the charges by stage (heap_tags.py) and what each stage kept by when it was allocated (survivors.py).
SAMPLE_JSON_KEYS: dict[str, type] = {sc.MEM_HOST_HEAP_BY_STAGE: list, sc.MEM_HOST_HEAP_SURVIVORS: dict}
DEVICE_KEYS = (
    sc.MEM_TORCH_ALLOCATED,
    sc.MEM_TORCH_RESERVED,
    sc.MEM_GPU_PROCESS,
    sc.MEM_GPU_USED,
    sc.MEM_GPU_TOTAL,
    sc.MEM_NATIVE,
)
SPAN_STRING_COLUMNS = ("trace_id", "span_id", "parent_id", "name", "status", "stage", "thread")
CATEGORICAL_COLUMNS = frozenset({"name", "stage", "status", "thread"})

# The journal end record's own fields, in the order of SPAN_HEAD_COLUMNS.
JOURNAL_HEAD_KEYS = ("trace_id", "span_id", "parent_id", "name", "status", "start", "t")
SPAN_HEAD_COLUMNS = ("trace_id", "span_id", "parent_id", "name", "status", "start_ns", "end_ns")
