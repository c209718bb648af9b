"""Hand-offs between stages (stages.py): what a releasing stage freed of another stage's allocations, and how
often it gained memory of its own, where the two stories a hand-off leaves open differ."""

from __future__ import annotations

import numpy as np

from vlmtrace.analysis.step2_preparing.stages import _cancel_hand_offs, _hand_offs

MiB = 1 << 20
NAMES = ["vision.preprocess", "engine.stream"]


def _gains(per_window: np.ndarray) -> float:
    retained, handed = _cancel_hand_offs(per_window)
    ((_, stage, releasing, _, gains),) = _hand_offs("host", NAMES, per_window, handed, retained, np.array([True, True]))
    assert (stage, releasing) == tuple(NAMES)
    return gains


def test_a_few_hundred_kib_charged_to_the_releasing_stage_beside_a_leak_are_no_gain_of_its_own():
    """Vision preprocessing keeps 8 MiB per window (a leak); under CPU load the intervals it shares with
    TurboMind's engine stream charge the stream a few hundred KiB either way, and now and then a few MiB it frees."""
    stream = np.array([-3, 0.26, 0.03, 0.05, -3.8, 0, 0, 0.05, 0, 0.75, 0, 0, 0.23, 0]) * MiB
    per_window = np.column_stack([8 * MiB - stream, stream])
    assert _gains(per_window) == 0.0


def test_a_releasing_stage_that_keeps_memory_of_its_own_gains_where_it_frees_less_than_it_keeps():
    """The engine stream keeps 1 MiB per window of its own and frees the image buffers vision preprocessing
    allocated (3 MiB, 0.2 MiB where the image was small): it gains a window's worth where the image was small."""
    images = np.where(np.arange(20) % 4 == 0, 0.2, 3.0) * MiB
    per_window = np.column_stack([images, 1 * MiB - images])
    assert _gains(per_window) == 0.25
