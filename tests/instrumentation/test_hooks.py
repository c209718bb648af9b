"""Wrapping and unwrapping the real LMDeploy 0.18 classes; what happens when internals moved."""

from __future__ import annotations

import importlib
import logging

import pytest
import wrapt
from opentelemetry.sdk.trace import TracerProvider

import vlmtrace
from vlmtrace.instrumentation import targets
from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor


def _owner_and_raw(target: targets.Target):
    module = importlib.import_module(target.module)
    owner, attribute = targets.resolve_attribute(module, target.qualname)
    return owner, attribute, vars(owner)[attribute]


def _all_target_modules_imported(family: targets.Family) -> None:
    for target in family.targets:
        importlib.import_module(target.module)


def test_family_for_installed_release_is_chosen_from_its_version():
    assert targets.installed_lmdeploy_version() == "0.18.0"
    assert targets.family_for("0.18.0") is targets.FAMILY_0_16
    assert targets.family_for(None) is targets.FAMILIES[-1]


def test_every_target_wraps_and_uninstrument_restores_the_exact_originals(standin_engines):
    family = targets.FAMILY_0_16
    _all_target_modules_imported(family)
    originals = {t.name: _owner_and_raw(t)[2] for t in family.targets}

    session = vlmtrace.instrument(tracer_provider=TracerProvider(), journal=None, sample_interval_ms=0)
    try:
        assert set(session.status.values()) == {"wrapped"}, session.status
        for target in family.targets:
            wrapped = _owner_and_raw(target)[2]
            assert isinstance(wrapped, wrapt.FunctionWrapper), target.name
            assert wrapped.__wrapped__ is originals[target.name]
        assert vlmtrace.instrument() is session  # idempotent: nothing wrapped twice
        assert not isinstance(_owner_and_raw(family.targets[0])[2].__wrapped__, wrapt.FunctionWrapper)
    finally:
        vlmtrace.uninstrument()

    assert LMDeployInstrumentor.session is None
    for target in family.targets:
        assert _owner_and_raw(target)[2] is originals[target.name], target.name
    vlmtrace.uninstrument()  # a second uninstrument is harmless


def test_a_moved_target_is_reported_and_the_rest_still_work(standin_engines, monkeypatch, caplog):
    moved = targets.Target(targets.REQUEST_PREPROCESS, "lmdeploy.serve.core.async_engine", "AsyncEngine.renamed")
    family = targets.Family("test", (0, 16), targets.FAMILY_0_16.targets + (moved,))
    monkeypatch.setattr(targets, "family_for", lambda version: family)
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        session = vlmtrace.instrument(tracer_provider=TracerProvider(), journal=None, sample_interval_ms=0)
    try:
        assert session.status[moved.name].startswith("missing:")
        assert "renamed" in session.status[moved.name]
        assert session.status["lmdeploy.serve.core.async_engine.AsyncEngine.preprocess"] == "wrapped"
        assert any("AsyncEngine.renamed" in r.getMessage() for r in caplog.records)
    finally:
        vlmtrace.uninstrument()


def test_doctor_probe_reports_found_and_why_missing():
    assert targets.probe_target(targets.FAMILY_0_16.targets[0]) == "found"
    missing = targets.probe_target(targets.Target("x", "lmdeploy.no_such_module", "Thing.method"))
    assert missing.startswith("missing: import failed (ModuleNotFoundError")


def test_unknown_option_is_rejected_before_anything_is_wrapped():
    with pytest.raises(TypeError, match="unknown vlmtrace option"):
        vlmtrace.instrument(jornal="typo")
    assert LMDeployInstrumentor.session is None
