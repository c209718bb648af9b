"""Fixtures: LMDeploy 0.18's real pipeline over the stand-in TurboMind (tests/support)."""

from __future__ import annotations

import pytest

from tests.support.cpu_lmdeploy import cpu_lmdeploy


@pytest.fixture(scope="session")
def standin_engines():
    pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")
    with cpu_lmdeploy() as built:
        yield built
