"""Verdicts in plain words, for the report's headline and the command line."""

from __future__ import annotations

import datetime

from vlmtrace.analysis import registry
from vlmtrace.analysis.rules import MIN_GROWTH_BYTES
from vlmtrace.analysis.step4_outlook.allocation_sites import site_clause
from vlmtrace.analysis.summary import Summary, Verdict
from vlmtrace.analysis.units import format_bytes, format_count, format_seconds

COMPONENT_NAMES = {component.name: component.label for component in registry.COMPONENTS}
CLASS_NAMES = registry.CLASS_LABELS


def stage_is_uncertain(verdict: Verdict) -> bool:
    return verdict.stage_uncertain


def verdict_sentence(verdict: Verdict, summary: Summary) -> str:
    """`Cache retention in vision.forward (94% of what the stages retained): +8.0 MiB per request, OOM in
    ~8,800 requests (~16 min)`; a stage the trace cannot name is said last, with the two candidates."""
    share = verdict.evidence.get("stage_share")
    caution = verdict.evidence.get("stage_uncertain")
    where = f" in {verdict.stage}" if verdict.stage else ""
    rise = verdict.evidence.get("stage_rise")
    from_sites = verdict.evidence.get("stage_from_sites")
    if verdict.stage and from_sites:
        where += f" (named by its allocation sites, {from_sites['explains']:.0%} of the rate, where the spans could not tell)"
    elif verdict.stage and share is not None:
        if verdict.evidence.get("stage_share_of"):
            where += f" ({share:.0%} of the growth of the large heap chunks still in use)"
        else:
            where += (
                f" ({share:.0%} of the rise in the run's last third)"
                if rise
                else f" ({share:.0%} of what the stages retained)"
            )
    if verdict.stage and verdict.evidence.get("heap_stage") == verdict.stage:
        where += ", where the heap counter's bytes in use rose too"
    if verdict.stage and verdict.evidence.get("allocating_stage") == verdict.stage:
        where += ", where its large heap chunks were allocated"
    if verdict.stage and caution:
        where += f" (uncertain: {caution})"
    text = f"{CLASS_NAMES[verdict.klass]}{where}: {_since(verdict)}{format_bytes(verdict.slope_bytes_per_request, signed=True)} per request"
    if verdict.component != "host" and summary.requests_to_oom is not None:
        text += f", OOM in ~{format_count(summary.requests_to_oom)} requests"
        if summary.seconds_to_oom is not None:
            text += f" (~{format_seconds(summary.seconds_to_oom)} at this trace's request rate)"
    if _since(verdict):
        before = verdict.regimes[-2]
        low, high = before["slope_interval_bytes_per_request"]
        text += (
            "; flat before"
            if low <= 0 <= high
            else f"; {format_bytes(before['slope_bytes_per_request'], signed=True)} per request before"
        )
    if not verdict.stage and caution:
        text += f"; stage not named: {caution}"
    if rise:
        text += f"; {rise}"
    for source in (
        "class_from_allocations",
        "class_from_survivors",
        "slope_from_trims",
        "slope_from_allocations",
        "slope_from_survivors",
    ):
        if verdict.evidence.get(source):
            text += f"; {verdict.evidence[source]}"
    return text


def _since(verdict: Verdict) -> str:
    """`growing since request ~120 (14:02): `, where the rate is the current growth regime's."""
    if verdict.onset is None or verdict.evidence.get("decision", {}).get("rule") != "GROWING_SINCE":
        return ""
    time = datetime.datetime.fromtimestamp(verdict.onset["time_ns"] / 1e9, tz=datetime.timezone.utc).strftime("%H:%M")
    return f"growing since request ~{verdict.onset['request']:,} ({time}): "


def unsettled_sentence(verdict: Verdict) -> str:
    """A rise that is no verdict yet (inconclusive) or too small for one (below the threshold)."""
    name = COMPONENT_NAMES[verdict.component]
    if verdict.klass == registry.INCONCLUSIVE:
        return f"{name}: inconclusive, not a leak yet — {verdict.evidence['inconclusive_reason']}"
    growth = verdict.evidence.get("growth_bytes")
    slope = verdict.slope_bytes_per_request
    floor = registry.BY_NAME[verdict.component].min_leak_rate
    under = (
        f"under the {format_bytes(floor)} per request that LMDeploy's own {name} reaches in long runs"
        if slope < floor
        else f"under the {format_bytes(MIN_GROWTH_BYTES)} a run must add to be worth a verdict"
    )
    return (
        f"{name}: slight growth, {format_bytes(slope, signed=True)} per request "
        f"({format_bytes(growth, signed=True)} over the run), {under}"
    )


def plateau_sentence(verdict: Verdict) -> str:
    reason = verdict.evidence.get("plateau_reason") or "stays level"
    return f"{COMPONENT_NAMES[verdict.component]}: plateau, not a leak — {reason}"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def crash_sentence(summary: Summary) -> str | None:
    """How the processes without a clean end ended (crashed, killed, still running; the first that did not
    run on leads) and the spans in flight when they stopped."""
    entries = summary.crash or []
    if not entries:
        return None
    lead = next((entry for entry in entries if not entry["ended"].startswith("still running")), entries[0])
    who = f"{lead['process']}: " if len(summary.processes) > 1 else "The process "
    others = len(entries) - 1
    chains = [chain for entry in entries for chain in entry["chains"]]
    longest = max(chains, key=len) if chains else []
    where = " → ".join(_short(step["name"]) for step in longest)
    count = len(summary.in_flight)
    text = f"{who}{lead['ended']}, with {count} span{'s' if count != 1 else ''} in flight"
    text = f"{text}: {where}" if where else text
    if others:
        text += f" ({others} more process{'es' if others != 1 else ''} without a clean end below)"
    steps = [
        (chain[-1]["name"], len(entry["linked_requests"][chain[-1]["span_id"]]))
        for entry in summary.crash or []
        for chain in entry["chains"]
        if chain and chain[-1].get("span_id") in entry.get("linked_requests", {})
    ]
    for name, requests in steps[:2]:  # an engine step is a trace of its own: its requests are links
        text += f"; and the engine step {name}, serving {requests} request{'s' if requests != 1 else ''}"
    return text


PULL_WARNINGS = {"pull_sample": "a sample", "pull_incomplete": "an incomplete pull"}


def headline(summary: Summary) -> list[str]:
    """The sentences that open the report, most important first. Traces pulled as a sample or cut short
    say so first, and beside each rate: it is the rate of the stretch read."""
    pulled = [warning for warning in summary.warnings if warning.get("kind") in PULL_WARNINGS]
    stretch = "".join(f" (over the {w['traces_read']} traces read: {PULL_WARNINGS[w['kind']]})" for w in pulled)
    ordered = sorted(summary.verdicts, key=lambda v: -v.slope_bytes_per_request)
    lines = [verdict_sentence(v, summary) + site_clause(v) + stretch for v in ordered if registry.is_leak(v.klass)]
    lines += [unsettled_sentence(v) for v in ordered if v.klass == registry.INCONCLUSIVE]
    crash = crash_sentence(summary)
    if crash:
        lines.insert(0, crash)
    if not lines or lines == [crash]:
        if summary.verdicts:
            lines.append(f"No memory growth found over {summary.requests_completed} requests")
            lines += [unsettled_sentence(v) for v in ordered if v.klass == registry.BELOW_THRESHOLD]
        elif summary.requests_completed:
            lines.append(
                f"No memory readings to judge growth by ({summary.requests_completed} requests, {summary.spans} spans)"
            )
        else:
            lines.append(f"No requests to judge growth by ({summary.spans} spans read)")
    return [warning["message"] for warning in pulled] + lines + detail_sentences(summary)


def detail_sentences(summary: Summary) -> list[str]:
    """Where a process sampled its requests' stage detail (`detail_every`), one sentence saying so."""
    lines = []
    several = len(summary.processes) > 1
    for process in summary.processes:
        detail = process.get("detail")
        if not detail:
            continue
        young = detail["young_requests"]
        after = f" after the first {young}" if young else ""
        suspected = ", and on every request while growth was suspected" if detail["while_suspected"] else ""
        lines.append(
            f"Stage detail on 1 in {detail['every']} requests{after}{suspected}"
            + (f" ({process['process']})" if several else "")
            + f": {detail['requests_without_detail']} requests recorded none, and stages are told apart by the others"
        )
    return lines
