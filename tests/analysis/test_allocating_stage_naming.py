"""When the heap counter's charges by allocating stage name a host stage (naming.allocation_stage): with
resident pages or the heap's bytes in use naming it too, or where resident pages cannot separate it from
the stage they put first (their spans ran together, docs/analysis.md, "What they decide")."""

from __future__ import annotations

import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis import naming

MiB = 1 << 20
TIED = "vision.preprocess (34%) or engine.stream (34%): their spans ran together"


def resident(**shares: float) -> pd.DataFrame:
    """Retained bytes per stage as resident pages charged them, largest first (stage names with dots spelled
    with underscores)."""
    rows = sorted(((stage.replace("_", "."), share * MiB) for stage, share in shares.items()), key=lambda r: -r[1])
    return pd.DataFrame(rows, columns=["stage", "retained_bytes"])


def test_resident_pages_leaders_are_the_stages_their_first_is_not_separated_from():
    assert naming.unseparated_leaders(resident(vision_preprocess=34, engine_stream=33.8, request=33), None) == (
        sc.STAGE_VISION_PREPROCESS, sc.STAGE_ENGINE_STREAM, sc.STAGE_REQUEST)
    assert naming.unseparated_leaders(resident(vision_preprocess=40, request=32, engine_stream=15), None) == (
        sc.STAGE_VISION_PREPROCESS, sc.STAGE_REQUEST)
    # one stage separated: resident pages name it, and there are no leaders to choose among
    assert naming.unseparated_leaders(resident(engine_stream=80, request=10), None) == ()
    # read by the sampler alone, the shares are too coarse to lead
    assert naming.unseparated_leaders(resident(vision_preprocess=34, engine_stream=33.8), 0.1) == ()


def test_the_allocating_stage_is_named_where_resident_pages_tie_it_with_their_first():
    """The third CPU table's second recording (stop 31): resident pages 34/34/33 %, the heap's bytes in use in
    vision preprocessing (the hand-off), the allocating stage the engine stream alone."""
    leaders = naming.unseparated_leaders(resident(vision_preprocess=34, engine_stream=33.8, request=33), None)
    evidence = {"heap_stage": sc.STAGE_VISION_PREPROCESS, "stage_uncertain": TIED}
    named = naming.allocation_stage(None, None, evidence, {sc.STAGE_ENGINE_STREAM: 1.95 * MiB}, 2 * MiB, leaders)
    assert named == sc.STAGE_ENGINE_STREAM
    assert evidence["allocating_stage"] == sc.STAGE_ENGINE_STREAM and evidence["stage_uncertain"] is None


def test_a_stage_resident_pages_hold_under_half_of_their_first_is_not_named_by_the_charges_alone():
    leaders = naming.unseparated_leaders(resident(vision_preprocess=40, request=32, engine_stream=15), None)
    evidence = {"heap_stage": sc.STAGE_VISION_PREPROCESS, "stage_uncertain": TIED}
    named = naming.allocation_stage(None, None, evidence, {sc.STAGE_ENGINE_STREAM: MiB}, MiB, leaders)
    assert named is None and evidence["stage_uncertain"] == TIED
    # ... nor one that explains under half of the verdict's rate, however resident pages lead
    evidence = {"heap_stage": None, "stage_uncertain": TIED}
    leaders = naming.unseparated_leaders(resident(engine_stream=34, vision_preprocess=33.8), None)
    assert naming.allocation_stage(None, None, evidence, {sc.STAGE_ENGINE_STREAM: 0.4 * MiB}, MiB, leaders) is None


HANDED = ("engine.stream or vision.preprocess: vision.preprocess freed 4.02 MiB of what engine.stream allocated and "
          "gained memory itself in 29% of the windows, so the memory kept may be vision.preprocess's own")


def test_a_stage_a_hand_off_withheld_is_named_where_its_own_chunks_are_what_grew():
    """The fifth CPU table (stop 32): resident pages put 95 % in the engine stream, withheld because vision
    preprocessing freed what the stream allocated; the stream's own large chunks grew 0.49 MiB a request."""
    evidence = {"heap_stage": None, "stage_uncertain": HANDED, "stage_share": 0.95}
    allocated = {sc.STAGE_ENGINE_STREAM: 0.49 * MiB, sc.STAGE_VISION_PREPROCESS: 0.06 * MiB}
    named = naming.allocation_stage(None, None, evidence, allocated, 0.5 * MiB, (), handed=sc.STAGE_ENGINE_STREAM)
    assert named == sc.STAGE_ENGINE_STREAM
    assert evidence["stage_uncertain"] is None and evidence["stage_share"] == 0.95  # resident pages' share stands


def test_a_hand_off_stays_withheld_where_the_releasing_stages_own_chunks_grew():
    """The memory kept is the releasing stage's own: its chunks are charged to it, not to the stage resident pages named."""
    evidence = {"heap_stage": None, "stage_uncertain": HANDED}
    allocated = {sc.STAGE_VISION_PREPROCESS: 0.5 * MiB}
    assert naming.allocation_stage(None, None, evidence, allocated, 0.5 * MiB, (), handed=sc.STAGE_ENGINE_STREAM) is None
    assert evidence["allocating_stage"] == sc.STAGE_VISION_PREPROCESS and evidence["stage_uncertain"] is not None
