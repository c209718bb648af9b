"""This release's target family: chosen right, every target where the table says, wrapped and put back."""

from __future__ import annotations

import importlib

import wrapt
from opentelemetry.sdk.trace import TracerProvider

import vlmtrace
from tests.matrix.release.this_release import FAMILY, RELEASE
from vlmtrace.cli import doctor
from vlmtrace.instrumentation import selection, targets
from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor


def _family() -> targets.Family:
    return next(family for family in targets.FAMILIES if family.name == FAMILY)


def _raw(target: targets.Target):
    """What the owner's own namespace holds under the target's name (no descriptor binding)."""
    owner, attribute = targets.resolve_attribute(importlib.import_module(target.module), target.qualname)
    return vars(owner)[attribute]


def test_the_installed_release_gets_its_family_by_version():
    assert targets.installed_lmdeploy_version() == RELEASE
    choice = selection.choose_family(RELEASE)
    assert choice.family is _family()
    assert "release range" in choice.reason


def test_the_installed_code_alone_leads_to_the_same_family():
    """What instrument() does for a version it does not know (source only), and what doctor does (imports)."""
    by_source = selection.choose_family(None)
    by_import = selection.choose_family(None, present=lambda t: targets.probe_target(t) == "found")
    assert by_source.family is _family(), by_source.reason
    assert by_import.family is _family(), by_import.reason


def test_every_target_is_defined_where_the_table_says():
    for target in _family().targets:
        assert targets.probe_target(target) == "found", target.name
        if target.module.startswith("lmdeploy."):
            assert selection.defined_in_source(target), target.name


def test_doctor_names_the_family_and_finds_every_target():
    report = doctor.diagnose()
    assert report["lmdeploy"] == RELEASE
    assert report["family"] == FAMILY
    assert [name for name, found in report["targets"].items() if found["status"] != "found"] == []
    assert set(report["targets"]) == {t.name for t in _family().targets}


def test_instrument_wraps_every_target_and_uninstrument_restores_the_originals():
    family = _family()
    originals = {target.name: _raw(target) for target in family.targets}

    session = vlmtrace.instrument(tracer_provider=TracerProvider(), journal=None, sample_interval_ms=0)
    try:
        assert session.family is family
        assert session.status == {target.name: "wrapped" for target in family.targets}
        for target in family.targets:
            wrapped = _raw(target)
            assert isinstance(wrapped, wrapt.FunctionWrapper), target.name
            assert wrapped.__wrapped__ is originals[target.name], target.name
    finally:
        vlmtrace.uninstrument()

    assert LMDeployInstrumentor.session is None
    for target in family.targets:
        assert _raw(target) is originals[target.name], target.name
