"""Journals recorded on an H200 with a known injected cause (data/gpu/README.md): the verdict names it.

Each scenario journal has the analyzer's JSON summary committed beside it (`<name>.summary.json`, from
`vlmtrace report FILE --json`); re-analysing the journal must give the same verdicts, so a change to
the analyzer cannot silently change its answer on real data.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from conftest import analyse, verdict

from vlmtrace import semconv as sc
from vlmtrace.analysis.analyze import Analysis
from vlmtrace.analysis.wording import crash_sentence

# These traces were recorded when prompt processing had a span of its own (docs/schema.md, "Earlier
# recordings"); it is part of the request span now.
PREPROCESS_AS_RECORDED = "lmdeploy.preprocess"

GPU = Path(__file__).parent / "data" / "gpu"
MiB = 1 << 20
ENGINE = {"turbomind": sc.STAGE_ENGINE_STREAM, "pytorch": sc.STAGE_ENGINE_FORWARD}
# scenario → (component, class, stage, injected bytes per request); benchmarks/gpu_scenarios.py injects
# them (one image per prompt, so per image = per request for tensor and cache).
SCENARIOS = {
    "none": (None, "no_growth", None, 0),
    "tensor": ("tensor", "tensor_leak", sc.STAGE_VISION_PREPROCESS, 4 * MiB),
    "cache": ("cache", "cache_retention", sc.STAGE_VISION_PREPROCESS, 12 * MiB),
    "native": ("native", "native_growth", "engine", 8 * MiB),
    "host": ("host", "host_growth", "engine", 4 * MiB),
}
CASES = {
    f"{backend}-{scenario}": (component, klass, ENGINE[backend] if stage == "engine" else stage, rate)
    for backend in ENGINE
    for scenario, (component, klass, stage, rate) in SCENARIOS.items()
}
REQUESTS = {"none": 182, "tensor": 194, "cache": 203, "native": 204, "host": 210}  # the runs' logs
SAMPLED = ("native", "host")  # read by the sampler (NVML, RSS), not at span edges: their stage is flagged


@functools.cache
def _analysis(name: str) -> Analysis:
    return analyse(GPU / f"{name}.jsonl.gz")


@pytest.mark.parametrize("name", sorted(CASES))
def test_injected_cause_is_found_in_a_real_trace(name: str):
    component, klass, stage, rate = CASES[name]
    analysis = _analysis(name)
    summary = analysis.summary
    assert not summary.crashed and summary.problems == []
    assert summary.requests == summary.requests_completed == REQUESTS[name.split("-")[1]]
    flagged = [v.component for v in summary.verdicts if v.klass != "no_growth"]
    if component is None:
        assert flagged == [] and not summary.leak_found
        assert {v.klass for v in summary.verdicts} == {"no_growth"}
        return
    assert flagged == [component]
    found = verdict(analysis, component)
    assert (found.klass, found.stage) == (klass, stage)
    assert abs(found.slope_bytes_per_request - rate) <= 0.1 * rate
    assert (found.evidence["stage_uncertain"] is not None) == (component in SAMPLED)


@pytest.mark.parametrize("name", [f"{b}-{s}" for b in ENGINE for s in ("tensor", "cache")])
def test_the_growth_per_image_is_found_as_the_driver(name: str):
    component, _, _, rate = CASES[name]
    driver = verdict(_analysis(name), component).evidence["driver"]
    assert driver["feature"] == "images" and abs(driver["bytes_per_unit"] - rate) <= 0.1 * rate


@pytest.mark.parametrize("name", sorted(CASES) + ["pytorch-crash", "turbomind-crash"])
def test_reanalysis_reproduces_the_committed_summary(name: str):
    committed = json.loads((GPU / f"{name}.summary.json").read_text())
    summary = _analysis(name).summary
    assert (summary.leak_found, summary.crashed) == (committed["leak_found"], committed["crashed"])
    assert (summary.requests, summary.requests_completed) == (committed["requests"], committed["requests_completed"])
    assert sorted(span["name"] for span in summary.in_flight) == sorted(span["name"] for span in committed["in_flight"])
    expected = {v["component"]: v for v in committed["verdicts"]}
    assert [v.component for v in summary.verdicts] == list(expected)
    for found in summary.verdicts:
        before = expected[found.component]
        assert (found.component, found.klass, found.stage) == (before["component"], before["class"], before["stage"])
        assert found.slope_bytes_per_request == pytest.approx(before["slope_bytes_per_request"], rel=0.01, abs=16 * 1024)


@pytest.mark.parametrize("name", ["pytorch-tensor", "pytorch-cache"])
def test_stage_shares_are_fractions_of_what_was_retained(name: str):
    """On the PyTorch engine the leaked tensors fill torch's free cache in vision.preprocess and the
    engine gives it back, so the cache's stages net positive and negative amounts. Shares divide by what
    the stages retained, so the named stage's share stays a fraction and the giving stage is negative."""
    summary = _analysis(name).summary
    for found in summary.verdicts:
        share = found.evidence["stage_share"]
        assert share is None or 0 < share <= 1
    for component in {row["component"] for row in summary.stages}:
        shares = [row["share"] for row in summary.stages if row["component"] == component]
        known = [share for share in shares if share is not None and not math.isnan(share)]  # NaN: nothing retained
        assert not known or sum(share for share in known if share > 0) == pytest.approx(1)


def _records(name: str) -> list[dict]:
    """The JSON records of a journal; a crashed one ends in zero bytes and faulthandler's text."""
    records = []
    with gzip.open(GPU / name, "rb") as journal:
        for line in journal:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def test_the_pytorch_seed2_abort_names_what_was_in_flight():
    """40 one-image prompts, vision max_batch_size=1, os.abort() from another thread mid third round."""
    summary = _analysis("pytorch-crash").summary
    assert summary.crashed and summary.leak_found is False and summary.problems == []
    assert (summary.requests, summary.requests_completed) == (120, 80)
    assert Counter(span["name"] for span in summary.in_flight) == {
        "chat tiny-qwen2vl": 40, sc.SPAN_PIPELINE_INFER: 1, sc.SPAN_PYTORCH_FORWARD: 1,
    }
    (crashed,) = summary.crash
    assert Counter(tuple(step["name"] for step in chain) for chain in crashed["chains"]) == {
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl"): 40, (sc.SPAN_PYTORCH_FORWARD,): 1,
    }
    # the engine step in flight: a decode of all 40 sequences, linked to the 40 requests in flight
    (step,) = [span for span in summary.in_flight if span["name"] == sc.SPAN_PYTORCH_FORWARD]
    attributes = step["attributes"]
    assert (attributes[sc.STAGE], attributes[sc.STEP_KIND], attributes[sc.STEP_SEQUENCES]) == (
        sc.STAGE_ENGINE_FORWARD, "decode", 40)
    assert crashed["linked_requests"] == {step["span_id"]: ["chat tiny-qwen2vl"] * 40}
    requests = [span for span in summary.in_flight if span["name"] == "chat tiny-qwen2vl"]
    assert sorted(span["attributes"][sc.LMDEPLOY_SESSION_ID] for span in requests) == attributes[sc.STEP_SESSION_IDS]
    assert step["start_unix_nano"] == crashed["last_record_unix_nano"]  # the last record before the abort
    assert crash_sentence(summary).endswith(
        f"{sc.SPAN_PIPELINE_INFER} → chat tiny-qwen2vl; and the engine step {sc.SPAN_PYTORCH_FORWARD}, serving 40 requests")
    # memory just before: the samples end within one sampler interval of the last record
    assert len(crashed["last_samples"]) == 5
    last = crashed["last_samples"][-1]
    assert 0 < crashed["last_record_unix_nano"] - last["t_unix_nano"] < 150_000_000
    assert 7.5e9 < last["tensor"] < 7.7e9 and last["native"] > 0.8e9  # the KV cache; CUDA context, cuBLAS
    # faulthandler's stacks, parsed from the text after the journal's zeroed tail
    (fatal,) = crashed["fatal"]
    assert fatal["title"] == "Fatal Python error: Aborted"
    (current,) = [thread for thread in fatal["threads"] if thread["current"]]
    assert current["frames"][0].endswith("in abort_when_busy") and "gpu_scenarios.py" in current["frames"][0]
    stacks = ["\n".join(thread["frames"]) for thread in fatal["threads"]]
    (engine,) = [stack for stack in stacks if "in _async_step" in stack]
    assert "lmdeploy/pytorch/strategies/ar/step_inputs.py" in engine and "vlmtrace/instrumentation/pytorch_engine.py" in engine
    assert any("lmdeploy/pipeline.py" in stack and "gpu_scenarios.py" in stack and "in run_crash" in stack for stack in stacks)


def test_the_pytorch_abort_came_mid_decode_of_the_third_round():
    """docs/gpu-runs.md quotes these facts of the round the abort cut short."""
    records = _records("pytorch-crash.jsonl.gz")
    infer = [r for r in records if r["k"] == "start" and r["name"] == sc.SPAN_PIPELINE_INFER]
    assert len(infer) == 3
    third = infer[-1]["t"]
    ended = [r for r in records if r["k"] == "end" and r["start"] >= third]
    assert Counter(r["name"] for r in ended if r["name"] != sc.SPAN_PYTORCH_FORWARD) == {
        sc.SPAN_VISION_PREPROCESS: 40, PREPROCESS_AS_RECORDED: 40, sc.SPAN_VISION_FORWARD: 6,
    }
    steps = [r["attrs"] for r in ended if r["name"] == sc.SPAN_PYTORCH_FORWARD]
    prefill = [s[sc.STEP_SEQUENCES] for s in steps if s[sc.STEP_KIND] == "prefill"]
    assert (len(prefill), sum(prefill)) == (6, 40)
    assert Counter(s[sc.STEP_SEQUENCES] for s in steps if s[sc.STEP_KIND] == "decode") == {40: 45, 1: 1}
    earlier = [r for r in records if r["k"] == "end" and r["name"] == "chat tiny-qwen2vl"]
    assert len(earlier) == 80 and {r["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] for r in earlier} == {64}


def test_the_turbomind_seed2_abort_names_what_was_in_flight():
    """The same shape on TurboMind: the abort came 153 ms into the third round, with the requests queued at the
    one-image vision preprocessing and seven streams in the engine; the stacks are there because the journal
    took the fatal signals back from TurboMind (its `warning` record says so)."""
    summary = _analysis("turbomind-crash").summary
    assert summary.crashed and summary.leak_found is False and summary.problems == []
    assert (summary.requests, summary.requests_completed) == (120, 96)
    assert Counter(span["name"] for span in summary.in_flight) == {
        sc.SPAN_PIPELINE_INFER: 1, "chat tiny-qwen2vl": 24, PREPROCESS_AS_RECORDED: 17, sc.SPAN_VISION_PREPROCESS: 17,
        sc.SPAN_TURBOMIND_STREAM: 7,
    }
    (crashed,) = summary.crash
    assert Counter(tuple(step["name"] for step in chain) for chain in crashed["chains"]) == {
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl", PREPROCESS_AS_RECORDED, sc.SPAN_VISION_PREPROCESS): 17,
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl", sc.SPAN_TURBOMIND_STREAM): 7,
    }
    assert crashed["linked_requests"] == {}  # TurboMind's steps are not spans: nothing links
    sessions = {name: sorted(span["attributes"][sc.LMDEPLOY_SESSION_ID] for span in summary.in_flight if span["name"] == name)
                for name in ("chat tiny-qwen2vl", PREPROCESS_AS_RECORDED, sc.SPAN_TURBOMIND_STREAM)}
    assert sessions == {"chat tiny-qwen2vl": list(range(96, 120)), PREPROCESS_AS_RECORDED: list(range(103, 120)),
                        sc.SPAN_TURBOMIND_STREAM: list(range(96, 103))}
    vision = [span["attributes"] for span in summary.in_flight if span["name"] == sc.SPAN_VISION_PREPROCESS]
    assert {(a[sc.VISION_IMAGES], a[sc.VISION_MAX_BATCH_SIZE]) for a in vision} == {(1, 1)}
    # the last record is the start of the stream of session 102, the one the event loop was converting
    (last,) = [span for span in summary.in_flight if span["start_unix_nano"] == crashed["last_record_unix_nano"]]
    assert (last["name"], last["attributes"][sc.LMDEPLOY_SESSION_ID]) == (sc.SPAN_TURBOMIND_STREAM, 102)
    # memory just before: torch holds nothing (TurboMind's own pool), native is the 8.68 GB of the engine
    assert len(crashed["last_samples"]) == 5
    sample = crashed["last_samples"][-1]
    assert 0 < crashed["last_record_unix_nano"] - sample["t_unix_nano"] < 150_000_000
    assert (sample["tensor"], sample["cache"]) == (0, 0) and 8.6e9 < sample["native"] < 8.7e9
    assert {v.klass for v in summary.verdicts} == {"no_growth"}
    # TurboMind had replaced the fatal-signal handlers; the journal put faulthandler back in front, before the abort
    (warning,) = summary.warnings
    assert warning["source"] == "faulthandler" and "SIGABRT" in warning["message"] and "replaced" in warning["message"]
    assert sample["t_unix_nano"] < warning["t"] < crashed["last_record_unix_nano"]
    (fatal,) = crashed["fatal"]
    assert fatal["title"] == "Fatal Python error: Aborted" and len(fatal["threads"]) == 26
    (current,) = [thread for thread in fatal["threads"] if thread["current"]]
    assert current["frames"][0].endswith("in abort_when_busy") and "gpu_scenarios.py" in current["frames"][0]
    stacks = ["\n".join(thread["frames"]) for thread in fatal["threads"]]
    (loop,) = [stack for stack in stacks if "in _thread_entry" in stack]  # the pipeline's event loop
    assert loop.splitlines()[0].endswith("in _resolve_fingerprint") and "lmdeploy/turbomind/turbomind.py" in loop
    assert "in async_stream_infer" in loop and "vlmtrace/instrumentation/request.py" in loop
    (encoder,) = [stack for stack in stacks if "lmdeploy/vl/model/qwen2.py" in stack]  # the one image in preprocessing
    assert "image_processing_qwen2_vl.py" in encoder and "concurrent/futures/thread.py" in encoder
    assert any("lmdeploy/pipeline.py" in stack and "in run_crash" in stack for stack in stacks)


def test_the_turbomind_abort_came_with_the_vision_queue_a_third_through():
    """docs/gpu-runs.md quotes these facts of the round the abort cut short."""
    records = _records("turbomind-crash.jsonl.gz")
    infer = [r for r in records if r["k"] == "start" and r["name"] == sc.SPAN_PIPELINE_INFER]
    assert len(infer) == 3
    third, last = infer[-1]["t"], records[-1]["t"]
    assert 150e6 < last - third < 155e6
    earlier = [r for r in records if r["k"] == "end" and r["name"] == "chat tiny-qwen2vl" and r["start"] < third]
    assert len(earlier) == 80 and {r["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] for r in earlier} == {64}
    ended = [r for r in records if r["k"] == "end" and r["start"] >= third]
    assert Counter(r["name"] for r in ended) == {
        sc.SPAN_VISION_PREPROCESS: 23, PREPROCESS_AS_RECORDED: 23, sc.SPAN_TURBOMIND_STREAM: 16, "chat tiny-qwen2vl": 16,
    }
    assert sorted(r["attrs"][sc.LMDEPLOY_SESSION_ID] for r in ended if r["name"] == sc.SPAN_TURBOMIND_STREAM) == list(range(80, 96))
    assert {r["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] for r in ended if r["name"] == "chat tiny-qwen2vl"} == {64}
    # all 40 images entered preprocessing within 11 ms; with max_batch_size=1 they came out one at a time
    starts = [r["t"] for r in records if r["k"] == "start" and r["name"] == sc.SPAN_VISION_PREPROCESS and r["t"] >= third]
    assert len(starts) == 40 and max(starts) - third < 11e6
    done = sorted(r["t"] for r in ended if r["name"] == sc.SPAN_VISION_PREPROCESS)
    assert all(3e6 < b - a < 10e6 for a, b in itertools.pairwise(done))
    (warning,) = [r for r in records if r["k"] == "warning"]
    assert 0 < last - warning["t"] < 20e6  # 19 ms before the abort: the check runs once a second


def _ended_spans(name: str) -> list[dict]:
    return [record for record in _records(name) if record["k"] == "end"]


@pytest.mark.parametrize("backend, engine_span", [("turbomind", "lmdeploy.turbomind.stream"),
                                                  ("pytorch", "lmdeploy.pytorch.forward")])
def test_recorded_runs_hold_one_parent_chain_per_request_and_the_engine(backend, engine_span):
    """docs/gpu-runs.md describes these runs; the chains and readings it quotes must stay in the files."""
    spans = _ended_spans(f"record-{backend}.jsonl.gz")
    by_id = {span["span_id"]: span for span in spans}
    requests = [span for span in spans if span["name"] == "chat tiny-qwen2vl"]
    assert len(requests) == 65
    for request in requests:
        assert by_id[request["parent_id"]]["name"] == sc.SPAN_PIPELINE_INFER
        assert 0 < request["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] <= 16
        assert request["attrs"][sc.GEN_AI_RESPONSE_FINISH_REASONS][0] in ("length", "stop")
    vision = [span for span in spans if span["name"] == sc.SPAN_VISION_PREPROCESS]
    assert {by_id[by_id[span["parent_id"]]["parent_id"]]["name"] for span in vision} == {"chat tiny-qwen2vl"}
    assert all(span["attrs"][sc.VISION_PIXELS] > 0 and sc.MEM_GPU_PROCESS in span["attrs"] for span in vision)
    engine = [span for span in spans if span["name"] == engine_span]
    if backend == "turbomind":
        assert {by_id[span["parent_id"]]["name"] for span in engine} == {"chat tiny-qwen2vl"}
        assert {span["attrs"][sc.MEM_TORCH_ALLOCATED] for span in engine} == {0}  # TurboMind's own pool
        assert min(span["attrs"][sc.MEM_NATIVE] for span in engine) > 8 * 10**9
    else:
        request_ids = {span["span_id"] for span in requests}
        schedules = [span for span in spans if span["name"] == "lmdeploy.pytorch.schedule"]
        linked = {link["span_id"] for span in schedules for link in span["links"]}
        assert request_ids <= linked  # every request served by the steps linked to it
        assert min(span["attrs"][sc.MEM_TORCH_ALLOCATED] for span in engine) > 7 * 10**9  # the KV cache
        vit = [span for span in spans if span["name"] == sc.SPAN_VISION_FORWARD]
        assert vit and {by_id[span["parent_id"]]["name"] for span in vit} == {engine_span}
