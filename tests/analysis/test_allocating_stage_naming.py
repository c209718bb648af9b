"""When the heap counter's charges by allocating stage name a host stage (naming.allocation_stage): wherever
they separate the stage that allocated what grew, whatever the other witnesses said
(docs/analysis.md, "What they decide")."""

from __future__ import annotations

import pandas as pd
import pytest

from vlmtrace import semconv as sc
from vlmtrace.analysis.step3_verdict import naming

MiB = 1 << 20
TIED = "vision.preprocess (34%) or engine.stream (34%): their spans ran together"


def resident(**shares: float) -> pd.DataFrame:
    """Retained bytes per stage as resident pages charged them, largest first (stage names with dots spelled
    with underscores)."""
    rows = sorted(((stage.replace("_", "."), share * MiB) for stage, share in shares.items()), key=lambda r: -r[1])
    return pd.DataFrame(rows, columns=["stage", "retained_bytes"])


def test_the_allocating_stage_is_named_where_resident_pages_tie_it_with_their_first():
    """A host leak in the engine stream recorded on the CPU: resident pages 34/34/33 %, the heap's bytes in use in
    vision preprocessing (the hand-off), the allocating stage the engine stream alone."""
    evidence = {"heap_stage": sc.STAGE_VISION_PREPROCESS, "stage_uncertain": TIED}
    named = naming.allocation_stage(None, None, evidence, {sc.STAGE_ENGINE_STREAM: 1.95 * MiB}, 2 * MiB)
    assert named == sc.STAGE_ENGINE_STREAM
    assert evidence["allocating_stage"] == sc.STAGE_ENGINE_STREAM and evidence["stage_uncertain"] is None


def test_the_allocating_stage_is_named_where_resident_pages_named_another():
    """Resident pages rise where the heap next needs fresh pages; the chunks' shares stand for the stage's, and
    the stage resident pages named stays in the evidence."""
    evidence = {"heap_stage": None, "stage_uncertain": None, "stage_share": 0.8}
    allocated = {sc.STAGE_ENGINE_STREAM: 0.9 * MiB, sc.STAGE_VISION_PREPROCESS: 0.1 * MiB}
    named = naming.allocation_stage(sc.STAGE_VISION_PREPROCESS, sc.STAGE_VISION_PREPROCESS, evidence, allocated, MiB)
    assert named == sc.STAGE_ENGINE_STREAM
    assert evidence["resident_stage"] == sc.STAGE_VISION_PREPROCESS
    assert evidence["stage_share"] == pytest.approx(0.9) and evidence["stage_share_of"] == naming.HEAP_ALLOCATIONS


def test_charges_that_separate_no_stage_leave_the_other_witnesses_stage():
    """Charges split between two stages, or explaining under half of the verdict's rate, name nothing."""
    evidence = {"heap_stage": None, "stage_uncertain": TIED}
    split = {sc.STAGE_ENGINE_STREAM: 0.5 * MiB, sc.STAGE_VISION_PREPROCESS: 0.4 * MiB}
    assert naming.allocation_stage(None, None, evidence, split, MiB) is None and evidence["stage_uncertain"] == TIED
    assert naming.allocation_stage(
        sc.STAGE_REQUEST, sc.STAGE_REQUEST, {}, {sc.STAGE_ENGINE_STREAM: 0.4 * MiB}, MiB
    ) == (sc.STAGE_REQUEST)


HANDED = (
    "engine.stream or vision.preprocess: vision.preprocess freed 4.02 MiB of what engine.stream allocated and "
    "gained memory itself in 29% of the windows, so the memory kept may be vision.preprocess's own"
)


def test_a_stage_a_hand_off_withheld_is_named_where_its_own_chunks_are_what_grew():
    """A host leak in the engine stream recorded on the CPU: resident pages put 95 % in the engine stream, withheld because vision
    preprocessing freed what the stream allocated; the stream's own large chunks grew 0.49 MiB a request."""
    evidence = {"heap_stage": None, "stage_uncertain": HANDED, "stage_share": 0.95}
    allocated = {sc.STAGE_ENGINE_STREAM: 0.49 * MiB, sc.STAGE_VISION_PREPROCESS: 0.06 * MiB}
    named = naming.allocation_stage(None, None, evidence, allocated, 0.5 * MiB, handed=sc.STAGE_ENGINE_STREAM)
    assert named == sc.STAGE_ENGINE_STREAM
    assert evidence["stage_uncertain"] is None and evidence["stage_share"] == 0.95  # resident pages' share stands


def test_a_hand_off_whose_releasing_stages_own_chunks_grew_names_the_releasing_stage():
    """The memory kept is the releasing stage's own: its chunks are charged to it, not to the stage resident pages named."""
    evidence = {"heap_stage": None, "stage_uncertain": HANDED}
    allocated = {sc.STAGE_VISION_PREPROCESS: 0.5 * MiB}
    named = naming.allocation_stage(None, None, evidence, allocated, 0.5 * MiB, handed=sc.STAGE_ENGINE_STREAM)
    assert named == sc.STAGE_VISION_PREPROCESS
    assert evidence["allocating_stage"] == sc.STAGE_VISION_PREPROCESS and evidence["stage_uncertain"] is None
