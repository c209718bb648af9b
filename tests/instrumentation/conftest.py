"""Fixtures: an in-memory span exporter, and LMDeploy 0.18's real pipeline over the stand-in engine."""

from __future__ import annotations

import pytest

from tests.support.cpu_lmdeploy import cpu_lmdeploy, tiny_vlm_path
from tests.support.spans import exporter, finished, image, parent_of, spans_by_name, traced  # noqa: F401 - fixtures, helpers

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")


@pytest.fixture(scope="session")
def standin_engines():
    with cpu_lmdeploy() as built:
        yield built


@pytest.fixture(scope="session")
def cpu_pipeline(standin_engines):
    from lmdeploy import TurbomindEngineConfig, VisionConfig, pipeline

    pipe = pipeline(
        tiny_vlm_path(),
        backend_config=TurbomindEngineConfig(session_len=2048, max_batch_size=4),
        vision_config=VisionConfig(max_batch_size=2),
        log_level="ERROR",
    )
    yield pipe
    pipe.close()
