"""The torch window's sites from a snapshot of `torch.cuda.memory._snapshot()`'s shape: blocks still
allocated that the window's trace saw allocated, grouped by their first frame outside torch, joined to the
stage whose wrapped function the stack passes through (the GPU run is benchmarks/gpu_capture.py)."""

from __future__ import annotations

from vlmtrace import semconv as sc
from vlmtrace.capture.sites import StageMap, group
from vlmtrace.capture.torch_window import _allocations
from vlmtrace.instrumentation import vision
from vlmtrace.instrumentation.targets import FAMILY_0_16

MiB = 1 << 20
VISION = vision.__file__
STACK = [
    {"filename": "/site-packages/torch/utils/_device.py", "line": 104, "name": "__torch_function__"},
    {"filename": "/srv/leaky.py", "line": 12, "name": "preprocess"},
    {"filename": VISION, "line": 153, "name": "wrapper"},
    {
        "filename": "/site-packages/lmdeploy/serve/processors/multimodal.py",
        "line": 440,
        "name": "_get_multimodal_prompt_input",
    },
]


def _block(address: int, frames: list, state: str = "active_allocated") -> dict:
    return {"address": address, "size": 4 * MiB, "state": state, "frames": frames}


def test_blocks_kept_from_the_window_are_grouped_by_their_first_frame_outside_torch():
    snapshot = {
        "segments": [
            {
                "device": 0,
                "blocks": [
                    _block(1, STACK),
                    _block(2, STACK),
                    _block(3, STACK, "inactive"),
                    _block(4, []),  # allocated before the window: no stack
                    _block(5, STACK),  # an earlier window's block: its stack kept, not in this window's trace
                ],
            }
        ],
        "device_traces": [[{"action": "alloc", "addr": address, "size": 4 * MiB} for address in (1, 2, 3)]],
    }
    (site,) = group(_allocations(snapshot), StageMap(FAMILY_0_16.targets))
    assert (site.frame.file, site.frame.line, site.count, site.bytes) == ("/srv/leaky.py", 12, 2, 8 * MiB)
    assert site.stage == sc.STAGE_VISION_PREPROCESS


def test_without_the_windows_trace_every_block_with_a_stack_counts():
    snapshot = {
        "segments": [{"blocks": [_block(1, STACK), _block(5, STACK)]}],
        "device_traces": [[{"action": "alloc", "addr": 9}] * 100_000],
    }  # the ring overflowed
    (site,) = group(_allocations(snapshot), StageMap(FAMILY_0_16.targets))
    assert site.count == 2
