"""Wrapping and unwrapping the real LMDeploy 0.18 classes; what happens when internals moved."""

from __future__ import annotations

import importlib
import logging

import pytest
import wrapt
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import vlmtrace
from vlmtrace.instrumentation import selection, targets
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
    choice = selection.choose_family("0.18.0")
    assert choice.family is targets.FAMILY_0_16
    assert "release range" in choice.reason


def test_a_version_no_family_covers_is_matched_by_what_the_installed_code_defines():
    for version in (None, "0.9.2", "not a version"):
        choice = selection.choose_family(version)
        assert choice.family is targets.FAMILY_0_16, version
        assert "100% of this family's required targets exist" in choice.reason
    lmdeploy_targets = [t for t in targets.FAMILY_0_16.targets if t.module.startswith("lmdeploy.")]
    assert all(selection.defined_in_source(t) for t in lmdeploy_targets)
    assert not selection.defined_in_source(targets.Target("x", "lmdeploy.serve.async_engine", "AsyncEngine.generate"))


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
    family = targets.Family("test", (0, 16), None, (*targets.FAMILY_0_16.targets, moved))
    monkeypatch.setattr(selection, "choose_family", lambda version: selection.Choice(family, "test"))
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


@pytest.mark.usefixtures("fresh_global_tracer_provider")
def test_an_option_instrument_cannot_use_is_a_warning_and_instrumenting_goes_on(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        session = vlmtrace.instrument(
            jornal="typo",
            sample_interval_ms="fast",
            otlp_endpoint=4318,
            journal=str(tmp_path / "j"),
            tracer_provider=TracerProvider(),
            meter_provider=None,
            logger_provider=None,
        )
    try:
        assert session is LMDeployInstrumentor.session and session.options.sample_interval_ms == 100
        assert session.options.journal == str(tmp_path / "j")
        assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # no configure() for 4318
        warnings = sorted(r.getMessage() for r in caplog.records if r.name == "vlmtrace.config")
        assert len(warnings) == 3, warnings
        assert "otlp_endpoint=4318 is not a string" in warnings[0]
        assert "sample_interval_ms='fast' is not an integer" in warnings[1]
        assert "unknown option(s) jornal, ignored" in warnings[2]
    finally:
        vlmtrace.uninstrument()


@pytest.mark.parametrize("spelling", ["off", "OFF", "False", "no", "0", False, None])
def test_journal_off_in_each_spelling_writes_no_journal_and_makes_no_directory(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    session = vlmtrace.instrument(journal=spelling, sample_interval_ms=0)
    try:
        assert session.tracing.journal is None
    finally:
        vlmtrace.uninstrument()
    assert list(tmp_path.iterdir()) == []


def test_journal_off_in_the_variable_makes_no_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLMTRACE_JOURNAL", "off")
    session = vlmtrace.instrument(sample_interval_ms=0)
    try:
        assert session.tracing.journal is None
    finally:
        vlmtrace.uninstrument()
    assert list(tmp_path.iterdir()) == []
