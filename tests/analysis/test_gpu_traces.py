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
from vlmtrace.analysis.pipeline import Analysis
from vlmtrace.analysis.registry import is_leak
from vlmtrace.analysis.wording import crash_sentence

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
# Read by the sampler (NVML, RSS) every 100 ms, not at span edges: several requests' stages fall in one
# sampling interval. The stage is named only where the counts of each stage's spans per interval
# separate it (the PyTorch engine's steps), always with the sampler's caution; else it is withheld.
SAMPLED = ("native", "host")


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
    flagged = [v.component for v in summary.verdicts if is_leak(v.klass)]
    if component is None:
        assert flagged == [] and not summary.leak_found
        assert {v.klass for v in summary.verdicts} <= {"no_growth", "below_threshold"}
        return
    assert flagged == [component]
    found = verdict(analysis, component)
    assert abs(found.slope_bytes_per_request - rate) <= 0.1 * rate
    if component in SAMPLED:
        assert found.klass == klass and found.stage in (stage, None)
        assert "sampler" in found.evidence["stage_uncertain"]
    else:
        assert (found.klass, found.stage) == (klass, stage)
        assert found.evidence["stage_uncertain"] is None and found.evidence["stage_share"] >= 0.6


@pytest.mark.parametrize("name", [f"{b}-{s}" for b in ENGINE for s in ("tensor", "cache")])
def test_the_growth_per_image_is_found_as_the_driver(name: str):
    component, _, _, rate = CASES[name]
    driver = verdict(_analysis(name), component).evidence["driver"]
    assert driver["feature"] == "images" and abs(driver["bytes_per_unit"] - rate) <= 0.1 * rate


@pytest.mark.parametrize("name", [*sorted(CASES), "pytorch-crash", "turbomind-crash"])
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
        assert found.slope_bytes_per_request == pytest.approx(
            before["slope_bytes_per_request"], rel=0.01, abs=16 * 1024
        )


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
    """40 one-image prompts, vision max_batch_size=1, os.abort() from another thread mid third round: it came
    while the engine ran the prefill of the round's last request, just after that step's ViT forward."""
    summary = _analysis("pytorch-crash").summary
    assert summary.crashed and summary.leak_found is False and summary.problems == []
    assert (summary.requests, summary.requests_completed) == (120, 80)
    assert Counter(span["name"] for span in summary.in_flight) == {
        "chat tiny-qwen2vl": 40,
        sc.SPAN_PIPELINE_INFER: 1,
        sc.SPAN_PYTORCH_FORWARD: 1,
    }
    (crashed,) = summary.crash
    assert Counter(
        {
            tuple(step["name"] for step in chain): count
            for chain, count in zip(crashed["chains"], crashed["chain_counts"])
        }
    ) == {
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl"): 40,
        (sc.SPAN_PYTORCH_FORWARD,): 1,
    }
    # the engine step in flight: the prefill of one sequence, session 119, linked to that one request
    (step,) = [span for span in summary.in_flight if span["name"] == sc.SPAN_PYTORCH_FORWARD]
    attributes = step["attributes"]
    assert (attributes[sc.STAGE], attributes[sc.STEP_KIND], attributes[sc.STEP_SEQUENCES]) == (
        sc.STAGE_ENGINE_FORWARD,
        "prefill",
        1,
    )
    assert crashed["linked_requests"] == {step["span_id"]: ["chat tiny-qwen2vl"]}
    requests = {
        span["span_id"]: span["attributes"][sc.LMDEPLOY_SESSION_ID]
        for span in summary.in_flight
        if span["name"] == "chat tiny-qwen2vl"
    }
    assert sorted(requests.values()) == list(range(80, 120)) and attributes[sc.STEP_SESSION_IDS] == [119]
    records = _records("pytorch-crash.jsonl.gz")
    (start,) = [r for r in records if r["k"] == "start" and r["span_id"] == step["span_id"]]
    assert [requests[link["span_id"]] for link in start["links"]] == [119]
    # the last record before the abort: the end of the ViT forward inside that step
    last = records[-1]
    assert (last["k"], last["name"], last["parent_id"]) == ("end", sc.SPAN_VISION_FORWARD, step["span_id"])
    assert last["t"] == crashed["last_record_unix_nano"] and 0 < last["t"] - step["start_unix_nano"] < 15_000_000
    assert crash_sentence(summary).endswith(
        f"{sc.SPAN_PIPELINE_INFER} → chat tiny-qwen2vl; and the engine step {sc.SPAN_PYTORCH_FORWARD}, serving 1 request"
    )
    # memory just before: the samples end within one sampler interval of the last record
    assert len(crashed["last_samples"]) == 5
    sample = crashed["last_samples"][-1]
    assert 0 < crashed["last_record_unix_nano"] - sample["t_unix_nano"] < 150_000_000
    assert 7.5e9 < sample["tensor"] < 7.7e9 and sample["native"] > 0.8e9  # the KV cache; CUDA context, cuBLAS
    assert {v.klass for v in summary.verdicts} == {"no_growth"}
    # the engine replaced the fatal-signal handlers during start-up (SIGSEGV first, then all five); the journal
    # put faulthandler back in front each time, before the first round
    first_round = min(r["t"] for r in records if r["k"] == "start" and r["name"] == sc.SPAN_PIPELINE_INFER)
    assert [w["source"] for w in summary.warnings] == ["faulthandler", "faulthandler"]
    assert "SIGSEGV was replaced" in summary.warnings[0]["message"] and "SIGABRT" in summary.warnings[1]["message"]
    assert all(w["t"] < first_round for w in summary.warnings)
    # faulthandler's stacks, parsed from the text after the journal's zeroed tail
    (fatal,) = crashed["fatal"]
    assert fatal["title"] == "Fatal Python error: Aborted" and len(fatal["threads"]) == 26
    (current,) = [thread for thread in fatal["threads"] if thread["current"]]
    assert current["frames"][0].endswith("in abort_when_busy") and "gpu_scenarios.py" in current["frames"][0]
    stacks = ["\n".join(thread["frames"]) for thread in fatal["threads"]]
    (engine,) = [stack for stack in stacks if "in _async_step" in stack]  # the prefill's attention, a triton kernel
    assert engine.splitlines()[0].startswith('File "') and "triton/backends/nvidia/driver.py" in engine.splitlines()[0]
    assert "lmdeploy/pytorch/kernels/cuda/flashattention.py" in engine and "in _forward_prefill" in engine
    assert "vlmtrace/instrumentation/pytorch_engine.py" in engine
    assert any(
        "lmdeploy/pipeline.py" in stack and "gpu_scenarios.py" in stack and "in run_crash" in stack for stack in stacks
    )


def test_the_pytorch_abort_came_in_the_third_rounds_last_prefill():
    """docs/gpu.md quotes these facts of the round the abort cut short."""
    records = _records("pytorch-crash.jsonl.gz")
    infer = [r for r in records if r["k"] == "start" and r["name"] == sc.SPAN_PIPELINE_INFER]
    assert len(infer) == 3
    third = infer[-1]["t"]
    assert 350e6 < records[-1]["t"] - third < 352e6
    ended = [r for r in records if r["k"] == "end" and r["start"] >= third]
    assert Counter(r["name"] for r in ended if r["name"] != sc.SPAN_PYTORCH_FORWARD) == {
        sc.SPAN_VISION_PREPROCESS: 40,
        sc.SPAN_VISION_FORWARD: 5,
    }
    assert max(r["t"] for r in ended if r["name"] == sc.SPAN_VISION_PREPROCESS) - third < 190e6
    steps = [r["attrs"] for r in ended if r["name"] == sc.SPAN_PYTORCH_FORWARD]
    assert [s[sc.STEP_SEQUENCES] for s in steps if s[sc.STEP_KIND] == "prefill"] == [1, 10, 5, 23]
    assert Counter(s[sc.STEP_SEQUENCES] for s in steps if s[sc.STEP_KIND] == "decode") == {39: 16, 1: 1}
    assert sorted(i for s in steps if s[sc.STEP_KIND] == "prefill" for i in s[sc.STEP_SESSION_IDS]) == list(
        range(80, 119)
    )
    earlier = [r for r in records if r["k"] == "end" and r["name"] == "chat tiny-qwen2vl"]
    assert len(earlier) == 80 and {r["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] for r in earlier} == {64}
    # prompt processing has no span of its own in these recordings: the vision spans sit under the request
    ids = {r["span_id"]: r["name"] for r in records if r["k"] == "start"}
    assert {ids[r["parent_id"]] for r in records if r["k"] == "end" and r["name"] == sc.SPAN_VISION_PREPROCESS} == {
        "chat tiny-qwen2vl"
    }
    assert "lmdeploy.preprocess" not in ids.values()


def test_the_turbomind_seed2_abort_names_what_was_in_flight():
    """The same shape on TurboMind: the abort came 88 ms into the third round, with the requests queued at the
    one-image vision preprocessing and eight streams in the engine; the stacks are there because the journal
    took the fatal signals back from TurboMind (its `warning` record says so)."""
    summary = _analysis("turbomind-crash").summary
    assert summary.crashed and summary.leak_found is False and summary.problems == []
    assert (summary.requests, summary.requests_completed) == (120, 94)
    assert Counter(span["name"] for span in summary.in_flight) == {
        sc.SPAN_PIPELINE_INFER: 1,
        "chat tiny-qwen2vl": 26,
        sc.SPAN_VISION_PREPROCESS: 18,
        sc.SPAN_TURBOMIND_STREAM: 8,
    }
    (crashed,) = summary.crash
    assert Counter(
        {
            tuple(step["name"] for step in chain): count
            for chain, count in zip(crashed["chains"], crashed["chain_counts"])
        }
    ) == {
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl", sc.SPAN_VISION_PREPROCESS): 18,
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl", sc.SPAN_TURBOMIND_STREAM): 8,
    }
    assert crashed["linked_requests"] == {}  # TurboMind's steps are not spans: nothing links
    requests = {
        span["span_id"]: span["attributes"][sc.LMDEPLOY_SESSION_ID]
        for span in summary.in_flight
        if span["name"] == "chat tiny-qwen2vl"
    }
    vision = [span for span in summary.in_flight if span["name"] == sc.SPAN_VISION_PREPROCESS]
    streams = [span for span in summary.in_flight if span["name"] == sc.SPAN_TURBOMIND_STREAM]
    assert sorted(requests.values()) == list(range(94, 120))
    assert sorted(requests[span["parent_id"]] for span in vision) == list(range(102, 120))  # parent: the request
    assert sorted(span["attributes"][sc.LMDEPLOY_SESSION_ID] for span in streams) == list(range(94, 102))
    assert {requests[span["parent_id"]] == span["attributes"][sc.LMDEPLOY_SESSION_ID] for span in streams} == {True}
    assert {
        (span["attributes"][sc.VISION_IMAGES], span["attributes"][sc.VISION_MAX_BATCH_SIZE]) for span in vision
    } == {(1, 1)}
    # the streams carry the scheduler of the latest sample, taken before any stream of the round began
    assert {
        (span["attributes"][sc.LMDEPLOY_TM_ACTIVE_SEQS], span["attributes"][sc.LMDEPLOY_TM_SCHEDULER_TICK])
        for span in streams
    } == {(0, 444)}
    # the last record is the start of the stream of session 101, the one the event loop was converting
    (last,) = [span for span in summary.in_flight if span["start_unix_nano"] == crashed["last_record_unix_nano"]]
    assert (last["name"], last["attributes"][sc.LMDEPLOY_SESSION_ID]) == (sc.SPAN_TURBOMIND_STREAM, 101)
    # memory just before: torch holds nothing (TurboMind's own pool), native is the 8.68 GB of the engine
    assert len(crashed["last_samples"]) == 5
    sample = crashed["last_samples"][-1]
    assert 0 < crashed["last_record_unix_nano"] - sample["t_unix_nano"] < 150_000_000
    assert (sample["tensor"], sample["cache"]) == (0, 0) and 8.6e9 < sample["native"] < 8.7e9
    assert {v.klass for v in summary.verdicts} == {"no_growth"}
    # TurboMind had replaced the fatal-signal handlers; the journal put faulthandler back in front, before the abort:
    # the check runs with every sample, and the first of the last five samples (~480 ms before the abort) found it
    (warning,) = summary.warnings
    assert warning["source"] == "faulthandler" and "SIGABRT" in warning["message"] and "replaced" in warning["message"]
    first, second = (s["t_unix_nano"] for s in crashed["last_samples"][:2])
    assert first < warning["t"] < second and 450e6 < crashed["last_record_unix_nano"] - warning["t"] < 500e6
    (fatal,) = crashed["fatal"]
    assert fatal["title"] == "Fatal Python error: Aborted" and len(fatal["threads"]) == 26
    (current,) = [thread for thread in fatal["threads"] if thread["current"]]
    assert current["frames"][0].endswith("in abort_when_busy") and "gpu_scenarios.py" in current["frames"][0]
    stacks = ["\n".join(thread["frames"]) for thread in fatal["threads"]]
    (loop,) = [stack for stack in stacks if "in _thread_entry" in stack]  # the pipeline's event loop
    assert loop.splitlines()[0].endswith("in _resolve_fingerprint") and "lmdeploy/turbomind/turbomind.py" in loop
    assert "in async_stream_infer" in loop and "vlmtrace/instrumentation/runtime.py" in loop
    (encoder,) = [stack for stack in stacks if "lmdeploy/vl/model/qwen2.py" in stack]  # the one image in preprocessing
    assert "image_processing_qwen2_vl.py" in encoder and "concurrent/futures/thread.py" in encoder
    assert any("lmdeploy/pipeline.py" in stack and "in run_crash" in stack for stack in stacks)


def test_the_turbomind_abort_came_with_the_vision_queue_past_half_way():
    """docs/gpu.md quotes these facts of the round the abort cut short."""
    records = _records("turbomind-crash.jsonl.gz")
    infer = [r for r in records if r["k"] == "start" and r["name"] == sc.SPAN_PIPELINE_INFER]
    assert len(infer) == 3
    third, last = infer[-1]["t"], records[-1]["t"]
    assert 88e6 < last - third < 89e6
    earlier = [r for r in records if r["k"] == "end" and r["name"] == "chat tiny-qwen2vl" and r["start"] < third]
    assert len(earlier) == 80 and {r["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] for r in earlier} == {64}
    ended = [r for r in records if r["k"] == "end" and r["start"] >= third]
    assert Counter(r["name"] for r in ended) == {
        sc.SPAN_VISION_PREPROCESS: 22,
        sc.SPAN_TURBOMIND_STREAM: 14,
        "chat tiny-qwen2vl": 14,
    }
    assert sorted(r["attrs"][sc.LMDEPLOY_SESSION_ID] for r in ended if r["name"] == sc.SPAN_TURBOMIND_STREAM) == list(
        range(80, 94)
    )
    assert {r["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] for r in ended if r["name"] == "chat tiny-qwen2vl"} == {64}
    assert all(29e6 < r["t"] - r["start"] < 35e6 for r in ended if r["name"] == sc.SPAN_TURBOMIND_STREAM)
    # all 40 images entered preprocessing within 8 ms; with max_batch_size=1 they came out one at a time
    starts = [
        r["t"] for r in records if r["k"] == "start" and r["name"] == sc.SPAN_VISION_PREPROCESS and r["t"] >= third
    ]
    assert len(starts) == 40 and max(starts) - third < 8e6
    done = sorted(r["t"] for r in ended if r["name"] == sc.SPAN_VISION_PREPROCESS)
    assert all(2e6 < b - a < 6e6 for a, b in itertools.pairwise(done))
    # the check runs with every sample: the warning came with the sample just before the first round
    (warning,) = [r for r in records if r["k"] == "warning"]
    before = max(r["t"] for r in records if r["k"] == "sample" and r["t"] < warning["t"])
    assert 0 < warning["t"] - before < 1e6 and 0 < infer[0]["t"] - warning["t"] < 10e6


def _ended_spans(name: str) -> list[dict]:
    return [record for record in _records(name) if record["k"] == "end"]


@pytest.mark.parametrize(
    "backend, engine_span", [("turbomind", "lmdeploy.turbomind.stream"), ("pytorch", "lmdeploy.pytorch.forward")]
)
def test_recorded_runs_hold_one_parent_chain_per_request_and_the_engine(backend, engine_span):
    """docs/gpu.md describes these runs; the chains and readings it quotes must stay in the files."""
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
