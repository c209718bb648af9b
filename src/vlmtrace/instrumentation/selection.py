"""Which family's target table applies to the installed LMDeploy.

The installed version decides when a family covers it. A release no family covers (0.6.5–0.11,
before 0.4) or an unknown version is matched by what its code defines: the family with the largest
share of its required targets present wins, the newest on a tie. `instrument()` looks that up
in the source files without importing anything (importing LMDeploy there would load torch and an
engine the application may never use); `vlmtrace doctor` may import, and passes an importing check.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import os
from collections.abc import Callable

from vlmtrace.instrumentation import targets
from vlmtrace.instrumentation.targets import Family, Target

PACKAGE = "lmdeploy"


@dataclasses.dataclass(frozen=True)
class Choice:
    family: Family
    reason: str  # how it was chosen, for the log and `vlmtrace doctor`


def choose_family(version: str | None, present: Callable[[Target], bool] | None = None) -> Choice:
    """The family covering `version`; else the one whose required targets are most present."""
    if version is not None:
        parsed = targets.parse_version(version)
        for family in targets.FAMILIES:
            if parsed and family.covers(parsed):
                return Choice(family, f"LMDeploy {version} is in its release range")
    check = present or defined_in_source
    scored = [(_share_present(family, check), family.first, family) for family in targets.FAMILIES]
    share, _, family = max(scored, key=lambda item: item[:2])
    known = f"LMDeploy {version} is in no family's release range" if version else "the LMDeploy version is unknown"
    return Choice(family, f"{known}; {share:.0%} of this family's required targets exist")


def _share_present(family: Family, present: Callable[[Target], bool]) -> float:
    required = [t for t in family.targets if t.required and t.module.split(".")[0] == PACKAGE]
    return sum(1 for t in required if present(t)) / len(required) if required else 0.0


def defined_in_source(target: Target) -> bool:
    """Whether the installed package's source defines `target` where the table says (no import)."""
    path = _module_file(target.module)
    if path is None:
        return False
    node: ast.AST | None = _parsed(path)
    for name in target.qualname.split("."):
        node = next(
            (
                child
                for child in getattr(node, "body", ())
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == name
            ),
            None,
        )
        if node is None:
            return False
    return True


def _module_file(module: str) -> str | None:
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level lookup imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        base = os.path.join(location, *rest)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


@functools.lru_cache(maxsize=64)
def _parsed(path: str) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as source:
            return ast.parse(source.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
