"""Fixtures: an in-memory span exporter, and LMDeploy 0.18's real pipeline over the stand-in engine."""

from __future__ import annotations

import pytest

from tests.support.cpu_lmdeploy import cpu_lmdeploy, standin_pipeline
from tests.support.spans import exporter, finished, image, parent_of, spans_by_name, traced  # noqa: F401 - fixtures, helpers

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")


@pytest.fixture(scope="session")
def standin_engines():
    with cpu_lmdeploy() as built:
        yield built


@pytest.fixture(scope="session")
def cpu_pipeline(standin_engines):
    pipe = standin_pipeline()
    yield pipe
    pipe.close()
