"""What to do about each cause found, in the terms of LMDeploy and PyTorch settings a user can change."""

from __future__ import annotations

from vlmtrace.analysis import registry
from vlmtrace.analysis.step4_outlook.empty_cache import EmptyCacheCost
from vlmtrace.analysis.step4_outlook.projection import DeviceOutlook
from vlmtrace.analysis.summary import Recommendation, Verdict
from vlmtrace.analysis.units import format_bytes, format_seconds


def _where(verdict: Verdict) -> str:
    return f"in {verdict.stage}" if verdict.stage else "across the request"


def _release_measured(cost: EmptyCacheCost, what: str, after: str) -> str:
    parts = [f"Measured in this trace: {cost.calls} {what}"]
    if cost.median_duration_s is not None:
        parts.append(f"median {format_seconds(cost.median_duration_s)} each")
    if cost.median_released_bytes is not None:
        parts.append(f"releasing {format_bytes(cost.median_released_bytes)} (median)")
    text = ", ".join(parts) + "."
    if cost.latency_penalty_s is not None:
        text += (
            f" Requests right after {after} took {format_seconds(cost.latency_after_s)} (median) against "
            f"{format_seconds(cost.latency_other_s)} for the others"
        )
        if cost.request_time_share is None:
            text += ": no slower here."
        else:
            text += (
                f": {format_seconds(cost.latency_penalty_s)} more, at least {cost.request_time_share:.1%} of all "
                "requests' time, because their memory must come from CUDA again (a request that a release "
                "overlaps pays too, which one trace cannot separate)."
            )
    return text


def _empty_cache_detail(cost: EmptyCacheCost, trims: EmptyCacheCost, stage: str | None) -> str:
    after = f"after {stage}" if stage else "after each request"
    if cost.measured:
        text = f"Releases the cached blocks {after}. " + _release_measured(cost, "calls", "a call")
    else:
        text = (
            f"Releases the cached blocks {after}. Its cost was not measured in this trace: vlmtrace times "
            "the application's own torch.cuda.empty_cache() calls (span torch.cuda.empty_cache), so add the "
            "call and trace again to see what it costs here."
        )
    if trims.measured:
        return text + " The cache guard trimmed instead: " + _release_measured(trims, "trims", "a trim")
    return text + (
        " To pay that cost only when memory runs short, let vlmtrace trim the cache off the request path: "
        "instrument(trim_cache='headroom=…') or VLMTRACE_TRIM_CACHE (docs/cache-guard.md)."
    )


def _cache_retention(
    verdict: Verdict, cost: EmptyCacheCost, trims: EmptyCacheCost, max_batch_size: int | None
) -> list[Recommendation]:
    evidence = verdict.evidence
    split = evidence.get("inactive_split_slope_bytes_per_request")
    retries = evidence.get("alloc_retries")
    why = (
        f"torch's reserved memory grows {format_bytes(verdict.slope_bytes_per_request)} per request {_where(verdict)} "
        "while its live tensors do not"
    )
    if split:
        why += f"; free fragments inside split blocks grow {format_bytes(split)} per request"
    if retries:
        why += f"; the allocator had to free its cache and retry {retries:g} times"
    batch = f" (now {max_batch_size})" if max_batch_size else ""
    return [
        Recommendation(
            "cache_retention",
            verdict.component,
            verdict.stage,
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            why + ". Expandable segments let the caching allocator grow one segment instead of keeping "
            "differently sized ones that later requests cannot reuse.",
        ),
        Recommendation(
            "cache_retention",
            verdict.component,
            verdict.stage,
            f"Call torch.cuda.empty_cache() after {verdict.stage or 'the vision stage'}",
            _empty_cache_detail(cost, trims, verdict.stage),
        ),
        Recommendation(
            "cache_retention",
            verdict.component,
            verdict.stage,
            f"Lower the vision batch size: VisionConfig(max_batch_size=…){batch}",
            "The cache keeps room for the largest vision batch it has served; smaller batches need less of it.",
        ),
        Recommendation(
            "cache_retention",
            verdict.component,
            verdict.stage,
            "Leave room for torch beside TurboMind: lower TurbomindEngineConfig(cache_max_entry_count=…)",
            "TurboMind takes that share of free GPU memory for its KV cache at start; what torch caches "
            "later has to fit in the rest, and TurboMind's allocator dies when it does not.",
        ),
    ]


def _tensor_leak(verdict: Verdict) -> list[Recommendation]:
    driver = verdict.evidence.get("driver")
    driven = f" It scales with {driver['feature'].replace('_', ' ')}." if driver else ""
    return [
        Recommendation(
            "tensor_leak",
            verdict.component,
            verdict.stage,
            f"Find what keeps tensors from {verdict.stage or 'each request'} alive",
            f"Live tensors grow {format_bytes(verdict.slope_bytes_per_request)} per request {_where(verdict)}.{driven} "
            "Look for lists, dicts or caches that keep outputs; to see the owners, record "
            "torch.cuda.memory._record_memory_history(max_entries=100000), dump two snapshots some "
            "requests apart (torch.cuda.memory._dump_snapshot) and compare them at pytorch.org/memory_viz.",
        )
    ]


def _native_growth(verdict: Verdict) -> list[Recommendation]:
    return [
        Recommendation(
            "native_growth",
            verdict.component,
            verdict.stage,
            f"Memory outside torch grows {_where(verdict)}",
            f"The process holds {format_bytes(verdict.slope_bytes_per_request)} more per request that torch did not "
            "allocate: TurboMind's pool, cuBLAS/cuDNN workspaces or NCCL buffers. Compare with a newer LMDeploy "
            "release, lower cache_max_entry_count to keep headroom, and check session_len and prefix caching.",
        )
    ]


def _heap_disagrees(verdict: Verdict) -> bool:
    """Whether the heap counter's bytes in use withheld the stage (host_stage; its charges by allocating stage
    name one wherever they separate it): one request at a time would not pin it either."""
    return "stage_withheld_by" in verdict.evidence


def _host_growth(verdict: Verdict) -> list[Recommendation]:
    resident = verdict.evidence.get("resident_slope_bytes_per_request")
    grows = (
        f"Resident memory grows {format_bytes(verdict.slope_bytes_per_request)} per request"
        if resident is None
        else f"The heap keeps {format_bytes(verdict.slope_bytes_per_request)} more in use per request "
        f"(resident memory: {format_bytes(resident)})"
    )
    detail = (
        f"{grows}: Python objects kept per request (decoded images, prompts, results). tracemalloc or memray "
        "shows where they are allocated."
    )
    if _heap_disagrees(verdict):
        detail += (
            f" The heap counter's bytes in use rose in {verdict.evidence['heap_stage']}, resident pages in "
            f"{verdict.evidence['resident_stage']}: the memory is allocated in one and may be kept or first "
            "written in the other, so look at both."
        )
    elif "heap_stage" not in verdict.evidence:
        detail += (
            " Resident memory grows where pages are first touched: memory kept from what the allocator had freed "
            "shows up in the next stage that needs new pages"
            + (", so look at the stages before it too." if verdict.stage else ".")
            + " To see where it is allocated too, trace again under `vlmtrace run --heap-counter`."
        )
    allocating = verdict.evidence.get("allocating_stage")
    if allocating is not None:
        rate = verdict.evidence["heap_allocated_by_stage"][allocating]
        detail += (
            f" Its large heap blocks still in use were allocated in {allocating} "
            f"({format_bytes(rate, signed=True)} per request): look there first."
        )
    return [
        Recommendation("host_growth", verdict.component, verdict.stage, f"Host memory grows {_where(verdict)}", detail)
    ]


def _sampled_sentence(verdicts: list[Verdict]) -> str:
    labels = sorted({registry.BY_NAME[v.component].label for v in verdicts})
    sentence = f"{' and '.join(labels)} {'are' if len(labels) > 1 else 'is'} read"
    return sentence[0].upper() + sentence[1:]


def recommendations(
    verdicts: list[Verdict],
    cost: EmptyCacheCost,
    devices: list[DeviceOutlook],
    max_batch_size: int | None,
    trims: EmptyCacheCost,
) -> list[Recommendation]:
    """`cost`: of the application's own empty_cache() calls; `trims`: of the cache guard's."""
    result: list[Recommendation] = []
    makers = {
        "cache_retention": lambda v: _cache_retention(v, cost, trims, max_batch_size),
        "tensor_leak": _tensor_leak,
        "native_growth": _native_growth,
        "host_growth": _host_growth,
    }
    for verdict in verdicts:
        if verdict.klass in makers:
            result.extend(makers[verdict.klass](verdict))
    uncertain = [v for v in verdicts if v.klass in makers and v.stage_uncertain]
    # The heap counter's disagreement has a reason of its own (_host_growth): more overlap is not it.
    overlapped = [v for v in uncertain if "sampler" not in v.evidence["stage_uncertain"] and not _heap_disagrees(v)]
    sampled = [v for v in uncertain if "sampler" in v.evidence["stage_uncertain"]]
    if overlapped:
        result.append(
            Recommendation(
                "stage_uncertain",
                overlapped[0].component,
                overlapped[0].stage,
                "Pin the stage: trace a run with one request at a time",
                f"The growth of {', '.join(sorted({v.component for v in overlapped}))} came while several stages ran "
                f"together ({overlapped[0].evidence['stage_uncertain'].split(':')[0]}), so which of them holds it is "
                "not named. With one prompt per pipeline call (or one client), each change belongs to one span.",
            )
        )
    if sampled:
        result.append(
            Recommendation(
                "stage_uncertain",
                sampled[0].component,
                sampled[0].stage,
                "Pin the stage: sample more often for a short run (VLMTRACE_SAMPLE_INTERVAL_MS=5)",
                f"{_sampled_sentence(sampled)} by the background sampler, and spans repeat its latest reading; "
                "changes can only be placed to within one sampling interval, which is longer than the spans.",
            )
        )
    first = next((device for device in devices if device.runs_out_first), None)
    if first is not None and len(devices) > 1:
        result.append(
            Recommendation(
                "device_imbalance",
                None,
                None,
                f"{first.device} runs out first",
                f"It has {format_bytes(first.headroom_bytes)} left and loses "
                f"{format_bytes(first.slope_bytes_per_request)} per request; "
                "balance the work across devices or give it more headroom.",
            )
        )
    return result
