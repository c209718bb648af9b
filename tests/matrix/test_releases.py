"""The version matrix: vlmtrace instrumented into the real Python code of LMDeploy 0.4.2, 0.6.1,
0.15.0 and 0.18.0, one process per release (the checks are in `release/`).

Each release's environment is built on first use (`environments.py`, needs PyPI); then every
release runs at once, each in a process of its own, and each test here reports one of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.matrix import environments
from tests.matrix.environments import RELEASES, REPO, Release

CHECKS = Path(__file__).parent / "release"
RUN_TIMEOUT_S = 300

pytestmark = pytest.mark.matrix


class Running:
    """One release's checks in a process of its own."""

    def __init__(self, release: Release) -> None:
        folder = environments.ensure(release)
        path = [p for p in (folder, str(REPO / "src"), str(REPO)) if p]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(path),
            VLMTRACE_MATRIX_RELEASE=release.version,
            VLMTRACE_MATRIX_FAMILY=release.family,
            PYTHONUNBUFFERED="1",
        )
        self.release = release
        self.log = open(REPO / ".venv" / "matrix" / f"lmdeploy-{release.version}.log", "w+")  # noqa: SIM115
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "python_files=check_*.py",
                "-o",
                f"faulthandler_timeout={RUN_TIMEOUT_S // 2}",
                str(CHECKS),
            ],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def result(self) -> tuple[int, float, str]:
        """(exit status, seconds, output), waiting at most RUN_TIMEOUT_S from the start."""
        try:
            status = self.process.wait(timeout=max(1.0, RUN_TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
        seconds = time.monotonic() - self.started
        self.log.seek(0)
        output = self.log.read()
        self.log.close()
        return status, seconds, output


def _start(release: Release) -> Running | Exception:
    try:
        return Running(release)
    except (OSError, subprocess.SubprocessError) as error:  # its environment could not be built
        return error


@pytest.fixture(scope="module")
def running(request: pytest.FixtureRequest) -> dict[str, Running | Exception]:
    """Each selected release's process starts as soon as its environment is ready; they all run at once."""
    selected = [
        item.callspec.params["release"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_release"
    ]
    environments.ROOT.mkdir(parents=True, exist_ok=True)
    started = {release.version: _start(release) for release in selected}
    yield started
    for run in started.values():
        if isinstance(run, Running) and run.process.poll() is None:
            run.process.kill()
            run.process.wait()


@pytest.mark.parametrize("release", RELEASES, ids=lambda release: release.version)
def test_release(release: Release, running: dict[str, Running | Exception]) -> None:
    run = running[release.version]
    if isinstance(run, Exception):
        pytest.fail(f"LMDeploy {release.version}: its environment could not be built: {run}")
    status, seconds, output = run.result()
    summary = next(
        (line for line in reversed(output.splitlines()) if " passed" in line or " failed" in line), "(no summary)"
    )
    print(f"LMDeploy {release.version} ({release.family}): {summary} [{seconds:.0f} s]")
    assert status == 0, f"LMDeploy {release.version}: checks failed (exit {status}):\n{output[-8000:]}"
