"""The memory components and verdict classes, in one place that every step of the analysis reads.

A component is derived from the raw readings (tables.py) and, when it grows, earns its leak class;
the other classes say why a component is *not* called a leak (docs/analysis.md, "Slope and class").
"""

from __future__ import annotations

import dataclasses

from vlmtrace.analysis.rules import HOST_MIN_LEAK_RATE


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    label: str  # what the report calls it
    derivation: str  # how it is made from the readings
    leak_class: str  # the verdict when it grows
    leak_label: str
    # Growth slower than this per request is not called a leak, however long the run (rules.HOST_MIN_LEAK_RATE).
    min_leak_rate: float = 0.0


COMPONENTS = (
    Component("tensor", "torch tensors (allocated)", "torch allocated", "tensor_leak", "Tensor leak"),
    Component(
        "cache",
        "torch cache (reserved − allocated)",
        "torch reserved − allocated",
        "cache_retention",
        "Cache retention",
    ),
    Component(
        "native",
        "GPU memory outside torch (native)",
        "NVML process memory − torch reserved",
        "native_growth",
        "Native memory growth",
    ),
    Component(
        "host", "host memory (RSS)", "resident set size", "host_growth", "Host memory growth", HOST_MIN_LEAK_RATE
    ),
)
BY_NAME = {component.name: component for component in COMPONENTS}
GPU_COMPONENTS = tuple(component.name for component in COMPONENTS if component.name != "host")

NO_GROWTH = "no_growth"  # the interval includes zero, or the rise is explained (plateau, release, warm-up that stopped)
BELOW_THRESHOLD = (
    "below_threshold"  # rises with 95% confidence, but by less than is worth a verdict (over the run, or per request)
)
INCONCLUSIVE = "inconclusive"  # rises, but slows down: too short a run to tell warm-up from a leak
LEAK_CLASSES = tuple(component.leak_class for component in COMPONENTS)
CLASS_LABELS = {
    NO_GROWTH: "No growth",
    BELOW_THRESHOLD: "Slight growth, below the reporting threshold",
    INCONCLUSIVE: "Inconclusive",
    **{component.leak_class: component.leak_label for component in COMPONENTS},
}
CLASSES = tuple(CLASS_LABELS)


def is_leak(klass: str) -> bool:
    return klass in LEAK_CLASSES
