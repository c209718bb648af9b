"""site_stage: a capture window's allocation sites name the stage of a growth the spans could not place,
only where one stage's sites explain most of the rate, well ahead of any other's, and the spans saw it keep
memory too."""

from __future__ import annotations

import pandas as pd
import pytest

from vlmtrace.analysis.step3_verdict.site_stage import site_stage

MiB = 1 << 20
RETAINED = pd.DataFrame({"stage": ["(outside any span)", "vision.preprocess"], "retained_bytes": [48 * MiB, 39 * MiB]})


def _site(stage: str | None, per_request: float) -> dict:
    return {"file": "model.py", "line": 1, "function": "f", "stage": stage, "bytes_per_request": per_request}


def test_one_stages_sites_explaining_the_rate_name_it():
    named = site_stage([_site("vision.preprocess", 4 * MiB), _site(None, 0.1 * MiB)], 4 * MiB, RETAINED)
    assert named == ("vision.preprocess", {"stage": "vision.preprocess", "explains": 1.0})


@pytest.mark.parametrize(
    ("sites", "retained"),
    [
        ([_site("vision.preprocess", 2 * MiB)], RETAINED),
        ([_site("vision.preprocess", 3 * MiB), _site("vision.forward", 2 * MiB)], RETAINED),
        ([_site("vision.forward", 4 * MiB)], RETAINED),
        ([_site(None, 4 * MiB)], RETAINED),
        ([_site("vision.preprocess", 4 * MiB)], RETAINED.assign(retained_bytes=[48 * MiB, 0])),
    ],
    ids=[
        "half the rate explained",
        "two stages' sites not separated",
        "a stage the spans saw keep nothing",
        "sites outside every stage",
        "the stage kept nothing by the spans",
    ],
)
def test_no_stage_is_named_from_sites_that_do_not_settle_it(sites: list[dict], retained: pd.DataFrame):
    assert site_stage(sites, 4 * MiB, retained) is None
