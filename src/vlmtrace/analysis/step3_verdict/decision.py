"""What decided a verdict, in words the summary and the report carry (`evidence["decision"]`): the
rule that decided the class (class_rules.py: its name, its words, the explanation), the best-fitting other
explanation (the runner-up), and where the stage and the rate were read from."""

from __future__ import annotations

from vlmtrace.analysis import rules
from vlmtrace.analysis.registry import BELOW_THRESHOLD, NO_GROWTH
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth

RATE_FROM_FIT = "the Theil–Sen slope of the settled levels against requests completed"
RATE_FROM_REGIME = "the Theil–Sen slope of the settled levels since the current growth regime began"
RATE_FROM_STAGE = "the rising stage's own charges, the rest of the process's warm-up left out"
RATE_FROM_TRIMS = "the lowest levels LMDeploy's heap trims left (what the process kept), not the rise between them"
RATE_FROM_ALLOCATIONS = "the large heap chunks the allocating stage made and still holds"
RATE_FROM_SURVIVORS = "what the stage kept of the chunks it allocated, by when they were allocated"


def _stage_from(stage: str | None, evidence: dict, rising: bool) -> str:
    if stage is None and not rising and not evidence.get("stage_uncertain"):
        return "none named: nothing kept growing"
    if stage is None:
        return evidence.get("stage_uncertain") or "no stage retained enough more than the others to be named"
    if evidence.get("stage_from_sites"):
        return (
            f"the allocation sites a capture window saw: this stage's explain "
            f"{evidence['stage_from_sites']['explains']:.0%} of the rate (SITE_STAGE_EXPLAINS), where the spans "
            "alone could not tell which stage held it"
        )
    if evidence.get("allocating_stage"):
        return "the stage whose work allocated the large heap chunks still in use"
    if evidence.get("stage_rise"):
        return "the one stage that kept rising while the rest of the process settled"
    if evidence.get("heap_stage"):
        return "the heap counter's bytes in use, charged to the stage whose work ran"
    share = evidence.get("stage_share")
    said = (
        f"{share:.0%} of what the stages retained" if isinstance(share, float) else "most of what the stages retained"
    )
    return (
        f"each change charged to the stage whose work ran: {said}, "
        f"at least {rules.SEPARATION:g} × the next stage (SEPARATION)"
    )


def decision(growth: ComponentGrowth, stage: str | None, evidence: dict, rate_from: str | None = None) -> dict:
    """`rate_from`: where the rate was read from instead of the fit."""
    decided = growth.decision
    assert decided is not None  # leaks.classify decided every growth it returns
    weighed = growth.weighed
    runner_up = weighed.runner_up(decided.explanation) if weighed is not None else None
    best = weighed.fits[0] if weighed is not None and weighed.fits else None
    if rate_from is None:
        rate_from = (
            RATE_FROM_TRIMS
            if growth.trims
            else RATE_FROM_STAGE
            if growth.beside_warmup
            else RATE_FROM_REGIME
            if decided.rule.name == "GROWING_SINCE"
            else RATE_FROM_FIT
        )
    return {
        "rule": decided.rule.name,
        "class": decided.json,
        "decided_by_words": decided.words,
        "explanation": decided.explanation,
        "runner_up": None
        if runner_up is None or best is None
        else {
            "explanation": runner_up.name,
            "bic_above_best": round(runner_up.bic - best.bic, 2),
        },
        "best_fit": None if best is None else best.name,
        "fits": None if weighed is None else weighed.to_dict(),
        "stage": _stage_from(stage, evidence, growth.klass not in (NO_GROWTH, BELOW_THRESHOLD)),
        "rate": rate_from,
    }
