"""Each verdict's allocation sites: the latest window of its process and component, the sites of its
stage first (all where none has it), the share of the rate they explain, and what is said where there are
none: native GPU memory has no sites, a leak without a window says how to open one."""

from __future__ import annotations

from vlmtrace.analysis.readers.captures import Capture
from vlmtrace.analysis.step4_outlook.allocation_sites import (
    NATIVE_NOTE,
    NO_WINDOW_NOTE,
    OUTSIDE_PYTHON_NOTE,
    attach_sites,
    site_clause,
)
from vlmtrace.analysis.summary import Verdict

MiB = 1 << 20


def _verdict(component: str, stage: str | None, rate: float, klass: str | None = None) -> Verdict:
    klass = klass or {"host": "host_growth", "tensor": "tensor_leak", "native": "native_growth"}[component]
    return Verdict(component, klass, rate, (rate, rate), None, stage, "h:7", False, {})


def _site(file: str, line: int, stage: str | None, per_request: float) -> dict:
    return {
        "file": file,
        "line": line,
        "function": "Encoder.preprocess",
        "stage": stage,
        "stack": [],
        "count": 1,
        "bytes": int(per_request * 10),
        "bytes_per_request": per_request,
    }


def _capture(components: list[str], sites: list[dict], end_ns: int, process: int = 0) -> Capture:
    return Capture(process, "j", 1, 0, end_ns, components, "tracemalloc", "auto", 10, "requests", None, sites, 0, 0)


def test_the_latest_window_of_the_component_gives_the_sites_of_the_verdicts_stage():
    host = _verdict("host", "vision.preprocess", MiB)
    old = _capture(["host"], [_site("/a/old.py", 1, "vision.preprocess", MiB)], end_ns=1)
    new = _capture(
        ["host"],
        [_site("/a/other.py", 5, "engine.stream", 2 * MiB), _site("/a/qwen2.py", 211, "vision.preprocess", 0.75 * MiB)],
        end_ns=2,
    )
    attach_sites([host], [old, new], ["h:7"])
    assert [site["file"] for site in host.allocation_sites] == ["/a/qwen2.py"]
    assert host.allocation_sites_explained == 0.75
    assert site_clause(host) == (
        ", allocated at qwen2.py:211 in `preprocess` (768.0 KiB per request in the capture "
        "window, the sites listed explain 75% of the rate)"
    )


def test_with_no_site_in_the_stage_every_site_is_listed_and_a_small_share_points_outside_python():
    host = _verdict("host", "engine.stream", 4 * MiB)
    attach_sites([host], [_capture(["host"], [_site("/a/x.py", 3, None, MiB)], end_ns=1)], ["h:7"])
    assert [site["line"] for site in host.allocation_sites] == [3]
    assert "none of the window's sites was allocated inside engine.stream" in host.allocation_sites_note
    assert OUTSIDE_PYTHON_NOTE in host.allocation_sites_note


def test_native_memory_has_no_sites_and_a_leak_without_a_window_says_how_to_open_one():
    native, tensor, flat = (
        _verdict("native", "engine.stream", MiB),
        _verdict("tensor", None, MiB),
        _verdict("host", None, 0, "no_growth"),
    )
    attach_sites([native, tensor, flat], [_capture(["native"], [_site("/a/x.py", 3, None, MiB)], end_ns=1)], ["h:7"])
    assert native.allocation_sites == [] and native.allocation_sites_note == NATIVE_NOTE
    assert tensor.allocation_sites == [] and tensor.allocation_sites_note == NO_WINDOW_NOTE
    assert flat.allocation_sites_note is None and site_clause(flat) == ""


def test_a_window_of_another_process_is_not_joined():
    host = _verdict("host", None, MiB)
    attach_sites([host], [_capture(["host"], [_site("/a/x.py", 3, None, MiB)], end_ns=1, process=1)], ["h:7", "h:8"])
    assert host.allocation_sites == [] and host.allocation_sites_note == NO_WINDOW_NOTE
