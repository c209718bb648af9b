"""Which target family a release gets: by version where a family covers it, else by what its code defines.
(Each family against the real code of a release: tests/matrix.)"""

from __future__ import annotations

import sys

import pytest

from vlmtrace.instrumentation import selection, targets


@pytest.mark.parametrize(
    ("version", "family"),
    [
        ("0.4.0", targets.FAMILY_0_4),
        ("0.4.2", targets.FAMILY_0_4),
        ("0.6.4", targets.FAMILY_0_4),
        ("0.12.0", targets.FAMILY_0_12),
        ("0.15.3", targets.FAMILY_0_12),
        ("0.16.0", targets.FAMILY_0_16),
        ("0.18.0", targets.FAMILY_0_16),
        ("1.0.0rc1", targets.FAMILY_0_16),
    ],
)
def test_a_release_in_a_family_range_gets_that_family_whatever_its_code(version, family):
    choice = selection.choose_family(version, present=lambda target: False)
    assert choice.family is family
    assert choice.reason == f"LMDeploy {version} is in its release range"


@pytest.mark.parametrize("version", ["0.3.0", "0.6.5", "0.9.2", "0.11.1", "a local build", None])
def test_a_release_no_family_covers_gets_the_family_whose_targets_its_code_has(version):
    """0.6.5–0.11 kept the 0.4 serving layer and changed the vision encoder and the PyTorch engine."""
    moved = {"lmdeploy.vl.engine.ImageEncoder.forward", "lmdeploy.pytorch.engine.engine.Engine._async_model_forward"}
    old_code = {t.name for t in targets.FAMILY_0_4.targets} - moved
    choice = selection.choose_family(version, present=lambda target: target.name in old_code)
    assert choice.family is targets.FAMILY_0_4
    assert choice.reason.endswith("82% of this family's required targets exist")


def test_code_that_has_every_target_of_two_families_gets_the_newer():
    both = {t.name for t in targets.FAMILY_0_12.targets + targets.FAMILY_0_16.targets}
    assert selection.choose_family(None, present=lambda t: t.name in both).family is targets.FAMILY_0_16


def test_the_source_check_reads_classes_and_methods_without_importing(tmp_path, monkeypatch):
    package = tmp_path / "lmdeploy"
    (package / "serve").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing the package is not allowed here')\n")
    (package / "serve" / "__init__.py").write_text("")
    (package / "serve" / "async_engine.py").write_text(
        "class AsyncEngine:\n    async def generate(self):\n        pass\n\ndef helper():\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lmdeploy", raising=False)  # found on sys.path, never imported

    def defined(module, qualname):
        return selection.defined_in_source(targets.Target("x", module, qualname))

    assert defined("lmdeploy.serve.async_engine", "AsyncEngine.generate")
    assert defined("lmdeploy.serve.async_engine", "helper")
    assert not defined("lmdeploy.serve.async_engine", "AsyncEngine.preprocess")
    assert not defined("lmdeploy.serve.async_engine", "VLAsyncEngine.generate")
    assert not defined("lmdeploy.serve.core.async_engine", "AsyncEngine.generate")
