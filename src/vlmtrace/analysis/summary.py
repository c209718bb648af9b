"""The JSON summary: the contract other tools (CI checks, tests, dashboards) read.

Stable keys (docs/analysis.md, "Summary JSON"): `spans`, `requests`, `crashed`, `in_flight[*].name /
trace_id / span_id / attributes`, `in_flight_left_out`, `verdicts[*].component / class / slope_bytes_per_request / stage /
evidence`, `devices`, `requests_to_oom`, `recommendations`. New keys may be added; none is renamed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import orjson

from vlmtrace.analysis import registry

SCHEMA = "vlmtrace.summary/1"
CLASSES = registry.CLASSES


def _number(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


@dataclasses.dataclass
class Verdict:
    component: str
    klass: str
    slope_bytes_per_request: float
    slope_interval_bytes_per_request: tuple[float, float]
    slope_bytes_per_second: float | None
    stage: str | None
    process: str
    plateau: bool
    evidence: dict
    # Growth regimes (step3_verdict/regimes.py): each with its start, end and rate; where the current one, rising
    # faster, began (`onset`: request and time) or where the last rising one ended (`stopped`, with what it kept).
    regimes: list[dict] = dataclasses.field(default_factory=list)
    onset: dict | None = None
    stopped: dict | None = None
    # step4_outlook/allocation_sites.py: the capture window's sites joined to the stage, largest first
    allocation_sites: list[dict] = dataclasses.field(default_factory=list)
    allocation_sites_explained: float | None = None  # share of the rate the listed sites explain
    allocation_sites_note: str | None = None

    @property
    def stage_uncertain(self) -> bool:
        """The trace could not separate the named stage from the runner-up stage."""
        return bool(self.evidence.get("stage_uncertain"))

    def to_dict(self) -> dict:
        return {
            "component": self.component,
            "class": self.klass,
            "slope_bytes_per_request": _number(self.slope_bytes_per_request),
            "slope_interval_bytes_per_request": [_number(v) for v in self.slope_interval_bytes_per_request],
            "slope_bytes_per_second": _number(self.slope_bytes_per_second),
            "stage": self.stage,
            "process": self.process,
            "plateau": self.plateau,
            "onset": self.onset,
            "stopped": self.stopped,
            "regimes": self.regimes,
            "evidence": self.evidence,
            "allocation_sites": self.allocation_sites,
            "allocation_sites_explained": _number(self.allocation_sites_explained),
            "allocation_sites_note": self.allocation_sites_note,
        }


@dataclasses.dataclass
class Recommendation:
    cause: str
    component: str | None
    stage: str | None
    action: str
    detail: str


@dataclasses.dataclass
class Summary:
    inputs: list[dict]
    spans: int
    spans_ended: int
    requests: int
    requests_completed: int
    processes: list[dict]
    crashed: bool
    in_flight: list[dict]  # the oldest spans in flight (analysis/copied.py bounds them)
    in_flight_left_out: int  # spans in flight not listed
    crash: list[dict] | None
    verdicts: list[Verdict]
    stages: list[dict]  # per process and component, the stages that retained or gave back most
    stages_left_out: int
    devices: list[dict]
    requests_to_oom: float | None
    seconds_to_oom: float | None
    empty_cache: dict
    cache_trims: dict  # the cache guard's trims, measured as empty_cache is
    heap_trims: dict  # LMDeploy's PyTorch engine trimming host memory, measured alike (released: host RSS)
    recommendations: list[Recommendation]
    snapshots: list[dict]
    problems: list[dict]
    dropped: dict
    warnings: list[dict]

    @property
    def leak_found(self) -> bool:
        return any(registry.is_leak(verdict.klass) for verdict in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["verdicts"] = [verdict.to_dict() for verdict in self.verdicts]
        fields["recommendations"] = [dataclasses.asdict(item) for item in self.recommendations]
        fields["requests_to_oom"] = _number(self.requests_to_oom)
        fields["seconds_to_oom"] = _number(self.seconds_to_oom)
        return {"schema": SCHEMA, "leak_found": self.leak_found, **fields}

    def to_json(self) -> bytes:
        return orjson.dumps(
            self.to_dict(),
            option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
            default=str,
        )
