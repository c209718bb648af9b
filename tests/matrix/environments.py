"""The LMDeploy releases the matrix runs, and the side-by-side environment each one needs.

The dev venv holds 0.18 with everything around it. An older release goes into a `pip install
--target` folder that is put in front of the venv's site-packages: LMDeploy itself (--no-deps:
its wheels pin torch ≤ 2.3, and torch stays the venv's 2.14.1 build) plus the few packages whose
venv version it cannot import with (transformers 5 lacks `is_safetensors_available`, 4.49–4.57
lack `LogitsWarper`; 4.48.3 needs tokenizers 0.21 and huggingface_hub < 1). A folder is built
once per requirement list and reused (`.venv/matrix/`, ignored by git).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / ".venv" / "matrix"
PIP_TIMEOUT_S = 600

_OLD_TRANSFORMERS = (
    "transformers==4.48.3",
    "tokenizers==0.21.4",
    "huggingface_hub==0.36.0",
    "fire==0.7.1",
    "sentencepiece==0.2.1",
)


@dataclasses.dataclass(frozen=True)
class Release:
    version: str
    family: str  # the target family vlmtrace must choose for it
    extra: tuple[str, ...] = ()  # packages the folder holds besides LMDeploy
    in_venv: bool = False  # the dev venv's own release: no folder

    @property
    def folder(self) -> Path:
        return ROOT / f"lmdeploy-{self.version}"

    @property
    def requirements(self) -> tuple[str, ...]:
        return (f"lmdeploy=={self.version}", *self.extra)


RELEASES = (
    Release("0.4.2", "0.4–0.6.4", _OLD_TRANSFORMERS),
    Release("0.6.1", "0.4–0.6.4", (*_OLD_TRANSFORMERS, "accelerate==1.10.1", "qwen-vl-utils==0.0.14")),
    Release("0.15.0", "0.12–0.15", ("qwen-vl-utils==0.0.14",)),
    Release("0.18.0", "0.16+", in_venv=True),
)


def ensure(release: Release) -> str:
    """The folder to put in front of sys.path for `release` ("" for the venv's own), built if needed."""
    if release.in_venv:
        return ""
    stamp = release.folder / ".requirements"
    wanted = "\n".join(release.requirements)
    if stamp.is_file() and stamp.read_text() == wanted:
        return str(release.folder)
    building = release.folder.with_name(release.folder.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-qq",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(building),
            *release.requirements,
        ],
        check=True,
        timeout=PIP_TIMEOUT_S,
        env=dict(os.environ, PIP_NO_INPUT="1"),
    )
    (building / ".requirements").write_text(wanted)
    shutil.rmtree(release.folder, ignore_errors=True)
    building.rename(release.folder)
    return str(release.folder)
